// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * The guest module's fixed-point rate arithmetic (guest/module/vtism_rate.c) built into the
 * simulator, unchanged, as its test and benchmark build it. build.rs compiles this.
 */
#include "vtism_rate_user.h"
#include "vtism_rate.c"
