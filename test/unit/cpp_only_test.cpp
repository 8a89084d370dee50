// The guard in cpp_only.hpp must reject PostgreSQL headers. This file checks
// that the macro it keys on is the one postgres.h defines.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#ifndef PG_INCLUDEDIR_SERVER
#error "PG_INCLUDEDIR_SERVER must name PostgreSQL's server include directory"
#endif

TEST(CppOnlyGuard, KeysOnTheMacroPostgresHDefines) {
    std::ifstream postgres_h(std::string(PG_INCLUDEDIR_SERVER) + "/postgres.h");
    ASSERT_TRUE(postgres_h.good());
    std::stringstream text;
    text << postgres_h.rdbuf();
    EXPECT_NE(text.str().find("#define POSTGRES_H"), std::string::npos);
}
