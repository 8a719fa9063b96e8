// The one Catch2 main shared by every test executable (TAP reporter for Meson).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <catch2/catch_reporter_tap.hpp>
