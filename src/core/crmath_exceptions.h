// The inputs where crmath.h's binary64 value rounds to another binary32 than the exact value does:
// {input bits (erf: of |x|), correctly rounded result bits}, sorted, ended by a sentinel. Printed by
// `mantis verify --function exp|erf|tanh --exhaustive --exceptions` (every binary32 input against
// MPFR); checked by tests/test_crmath.cpp. Do not edit.
#pragma once

#define MANTIS_CRMATH_EXP_EXCEPTIONS \
  { {0xffffffffu, 0} }

#define MANTIS_CRMATH_ERF_EXCEPTIONS \
  { {0xffffffffu, 0} }

#define MANTIS_CRMATH_TANH_EXCEPTIONS \
  { {0xffffffffu, 0} }
