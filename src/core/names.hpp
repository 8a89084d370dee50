// Limits and validation of the names callers give (resources, buckets, locks).
#pragma once
#include "core/cpp_only.hpp"

#include <cstddef>

namespace pg_throttle::core {

// Longest name, in bytes of the database encoding.
inline constexpr std::size_t kMaxNameBytes = 200;
// Longest holder description kept for operators, in bytes, without the NUL.
inline constexpr std::size_t kMaxHolderBytes = 63;

enum class NameCheck { kOk, kEmpty, kTooLong };

constexpr NameCheck check_name_length(std::size_t bytes) noexcept {
    if (bytes == 0) {
        return NameCheck::kEmpty;
    }
    return bytes > kMaxNameBytes ? NameCheck::kTooLong : NameCheck::kOk;
}

}  // namespace pg_throttle::core
