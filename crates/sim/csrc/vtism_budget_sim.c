// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * The guest module's CPU budget (guest/module/vtism_budget.c) built into the simulator,
 * unchanged. build.rs compiles this.
 */
#include "vtism_rate_user.h"
#include "vtism_budget.c"
