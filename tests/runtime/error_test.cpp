#include <catch2/catch.hpp>

#include "runtime/core/error.hpp"
#include "runtime/core/natural_order.hpp"
#include "runtime/core/suggest.hpp"

using namespace ashlar;

TEST_CASE("an Ashlar error renders its code and context for users") {
  auto err = make_error(errc::io_error, "cannot open /x: No such file");
  CHECK(is(err, errc::io_error));
  CHECK_FALSE(is(err, errc::corrupt_data));
  CHECK(describe(err) == "io_error: cannot open /x: No such file");
  CHECK(describe(caf::error{}) == "no error");
  CHECK_FALSE(is(caf::error{}, errc::io_error)); // no error is no Ashlar error, and no crash
}

TEST_CASE("a mistyped name gets the one it is close to, and nothing when none is close or two are") {
  const std::vector<std::string> commands{"train", "bench", "node", "launch", "status", "ctl", "checkpoint", "cert"};
  CHECK(edit_distance("trian", "train") == 1); // a swap of neighbours is one edit
  CHECK(edit_distance("Train", "train") == 0);
  CHECK(closest("trian", commands) == "train");
  CHECK(closest("checkpiont", commands) == "checkpoint");
  CHECK(closest("lanch", commands) == "launch");
  CHECK(closest("stat", commands) == "status"); // a prefix of one
  CHECK(closest("xyz", commands).empty());
  CHECK(closest("cet", {"cert", "cat"}).empty()); // two as close: no guess
  CHECK(closest("", commands).empty());
  CHECK(did_you_mean("nod", commands) == " (did you mean 'node'?)");
  CHECK(did_you_mean("zzzzzz", commands).empty());
}

TEST_CASE("natural order reads digit runs as numbers") {
  CHECK(ashlar::natural_less("worker-2", "worker-10"));
  CHECK_FALSE(ashlar::natural_less("worker-10", "worker-2"));
  CHECK(ashlar::natural_less("worker-0", "worker-1"));
  CHECK(ashlar::natural_less("vm:999", "vm:1000"));
  CHECK(ashlar::natural_less("a", "b"));
  CHECK(ashlar::natural_less("node", "node-1"));
  CHECK_FALSE(ashlar::natural_less("x7", "x007")); // equal as numbers
  CHECK_FALSE(ashlar::natural_less("x007", "x7"));
  CHECK_FALSE(ashlar::natural_less("same", "same"));
}
