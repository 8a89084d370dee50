#include "core/time_math.hpp"

namespace pg_throttle::core {

Micros saturating_add(Micros a, Micros b) noexcept {
    Micros sum = 0;
    if (__builtin_add_overflow(a, b, &sum)) {
        return b > 0 ? std::numeric_limits<Micros>::max() : std::numeric_limits<Micros>::min();
    }
    return sum;
}

Micros saturating_sub(Micros a, Micros b) noexcept {
    Micros difference = 0;
    if (__builtin_sub_overflow(a, b, &difference)) {
        return b < 0 ? std::numeric_limits<Micros>::max() : std::numeric_limits<Micros>::min();
    }
    return difference;
}

std::optional<Micros> interval_to_micros(std::int32_t months, std::int32_t days,
                                         std::int64_t micros) noexcept {
    Micros from_months = 0;
    Micros from_days = 0;
    Micros total = 0;
    if (__builtin_mul_overflow(static_cast<Micros>(months), kUsPerMonth, &from_months) ||
        __builtin_mul_overflow(static_cast<Micros>(days), kUsPerDay, &from_days) ||
        __builtin_add_overflow(from_months, from_days, &total) ||
        __builtin_add_overflow(total, micros, &total)) {
        return std::nullopt;
    }
    return total;
}

std::int32_t sleep_timeout_ms(Micros sleep_us) noexcept {
    constexpr Micros kLongest = std::numeric_limits<std::int32_t>::max();
    if (sleep_us <= 1000) {
        return 1;
    }
    const Micros ms = sleep_us / 1000 + (sleep_us % 1000 != 0 ? 1 : 0);
    return static_cast<std::int32_t>(ms < kLongest ? ms : kLongest);
}

}  // namespace pg_throttle::core
