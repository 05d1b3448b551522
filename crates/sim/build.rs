//! Compiles the guest module's rate arithmetic (guest/module/vtism_rate.c) and CPU budget
//! (vtism_budget.c) into the simulator, so that `vtism sim` estimates rates and spends the
//! budget with the module's own code (src/rate.rs, src/budget.rs).

fn main() {
    let module = std::path::Path::new("../../guest/module");
    println!("cargo:rerun-if-changed=csrc/vtism_rate_sim.c");
    println!("cargo:rerun-if-changed=csrc/vtism_budget_sim.c");
    for f in [
        "vtism_rate.c",
        "vtism_budget.c",
        "vtism_guest.h",
        "vtism_rate_user.h",
    ] {
        println!("cargo:rerun-if-changed={}", module.join(f).display());
    }
    cc::Build::new()
        .file("csrc/vtism_rate_sim.c")
        .file("csrc/vtism_budget_sim.c")
        .include(module)
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("vtism_module");
}
