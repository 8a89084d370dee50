#include "core/sync_standbys.hpp"

#include <gtest/gtest.h>

namespace pg_throttle::core {
namespace {

TEST(SyncStandbys, MinorReleasesThatKeepFlags) {
    EXPECT_FALSE(server_has_sync_standbys_flags(150012));
    EXPECT_TRUE(server_has_sync_standbys_flags(150013));
    EXPECT_FALSE(server_has_sync_standbys_flags(160008));
    EXPECT_TRUE(server_has_sync_standbys_flags(160009));
    EXPECT_FALSE(server_has_sync_standbys_flags(170004));
    EXPECT_TRUE(server_has_sync_standbys_flags(170005));
    EXPECT_TRUE(server_has_sync_standbys_flags(180000));
}

// A module built against older headers reads a newer server's flags: the
// byte 3 (initialised | defined) must mean "wait", never be taken for a bool.
TEST(SyncStandbys, FlagsOfANewerServer) {
    EXPECT_TRUE(sync_standbys_defined(3, true, false));
    EXPECT_FALSE(sync_standbys_defined(1, true, true));  // initialised, none defined
    EXPECT_TRUE(sync_standbys_defined(0, true, true));   // not initialised: the setting
    EXPECT_FALSE(sync_standbys_defined(0, true, false));
}

TEST(SyncStandbys, BoolOfAnOlderServer) {
    EXPECT_TRUE(sync_standbys_defined(1, false, false));
    EXPECT_FALSE(sync_standbys_defined(0, false, true));
}

}  // namespace
}  // namespace pg_throttle::core
