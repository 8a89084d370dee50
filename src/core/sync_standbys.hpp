// Whether PostgreSQL's walsenders wait for synchronous standbys, decided from
// the byte WalSndCtl keeps for it. The byte changed meaning in minor releases
// 15.13, 16.9 and 17.5: before, a bool "defined"; from then on, flags with an
// "initialised" bit (until the checkpointer has set them, the setting
// synchronous_standby_names decides). Which meaning applies is the running
// server's, which the module need not have been built against.
#pragma once
#include "core/cpp_only.hpp"

#include <cstdint>

namespace pg_throttle::core {

// Whether server_version_num `version` keeps the byte as flags.
constexpr bool server_has_sync_standbys_flags(int version) noexcept {
    return (version >= 150013 && version < 160000) || (version >= 160009 && version < 170000) ||
           version >= 170005;
}

// `raw` is the byte as read, never through a bool; `names_set` whether
// synchronous_standby_names is non-empty.
bool sync_standbys_defined(std::uint8_t raw, bool server_has_flags, bool names_set) noexcept;

}  // namespace pg_throttle::core
