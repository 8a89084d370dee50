#include "core/sync_standbys.hpp"

namespace pg_throttle::core {

bool sync_standbys_defined(std::uint8_t raw, bool server_has_flags, bool names_set) noexcept {
    constexpr std::uint8_t kInitialised = 1U << 0U;  // SYNC_STANDBY_INIT
    constexpr std::uint8_t kDefined = 1U << 1U;      // SYNC_STANDBY_DEFINED
    if (!server_has_flags) {
        return raw != 0;  // the bool of the older layout
    }
    if ((raw & kInitialised) != 0) {
        return (raw & kDefined) != 0;
    }
    return names_set;
}

}  // namespace pg_throttle::core
