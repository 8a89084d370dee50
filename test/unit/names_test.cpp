#include "core/names.hpp"

#include <gtest/gtest.h>

namespace pg_throttle::core {
namespace {

TEST(Names, EmptyIsRejected) {
    EXPECT_EQ(check_name_length(0), NameCheck::kEmpty);
}

TEST(Names, LimitIsInclusive) {
    EXPECT_EQ(check_name_length(1), NameCheck::kOk);
    EXPECT_EQ(check_name_length(kMaxNameBytes), NameCheck::kOk);
    EXPECT_EQ(check_name_length(kMaxNameBytes + 1), NameCheck::kTooLong);
}

TEST(Names, LimitIsAtLeastTwoHundredBytes) {
    EXPECT_GE(kMaxNameBytes, 200U);
}

}  // namespace
}  // namespace pg_throttle::core
