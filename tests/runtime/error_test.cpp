#include <catch2/catch.hpp>

#include "runtime/core/error.hpp"

using namespace ashlar;

TEST_CASE("an Ashlar error renders its code and context for users") {
  auto err = make_error(errc::io_error, "cannot open /x: No such file");
  CHECK(is(err, errc::io_error));
  CHECK_FALSE(is(err, errc::corrupt_data));
  CHECK(describe(err) == "io_error: cannot open /x: No such file");
  CHECK(describe(caf::error{}) == "no error");
  CHECK_FALSE(is(caf::error{}, errc::io_error)); // no error is no Ashlar error, and no crash
}
