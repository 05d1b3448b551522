//! `vtism demo` end to end: the binary a user runs, its JSON output checked, not its logs.

use std::process::Command;

fn vtism(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vtism"))
        .args(args)
        .output()
        .expect("run vtism")
}

#[test]
fn demo_converges_rejects_the_hostile_round_and_keeps_the_quota() {
    let out = vtism(&[
        "demo",
        "--json",
        "--vm-mib",
        "256",
        "--quota-mib",
        "64",
        "--hot-mib",
        "32",
        "--cold-fast-mib",
        "64",
        "--budget-mib",
        "16",
        "--rounds",
        "16",
        "--move-at",
        "9",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 17, "16 rounds and a summary");
    for l in &lines[..16] {
        assert!(
            l["fast_mib"].as_f64().unwrap() <= 64.0,
            "quota exceeded: {l}"
        );
    }
    assert!(
        lines[4]["verdict"]
            .as_str()
            .unwrap()
            .starts_with("REJECTED: gfn_out_of_range"),
        "{}",
        lines[4]
    );
    let s = &lines[16];
    assert_eq!(s["rejected_rounds"], 1);
    assert_eq!(s["accepted_rounds"], 15);
    // 32 MiB hot set at 8 MiB of promotions a round (half the budget demotes): 4-5 rounds.
    let r90 = s["rounds_to_90pct"]
        .as_u64()
        .expect("hot set never reached 90%");
    assert!(r90 <= 6, "took {r90} rounds");
    assert!(
        s["rounds_to_90pct_after_move"].as_u64().is_some(),
        "did not follow the moved hot set: {s}"
    );
    assert!(s["final_hot_in_fast_pct"].as_f64().unwrap() >= 95.0);
}

#[test]
fn bad_options_are_named() {
    let out = vtism(&["demo", "--quota-mib", "999999"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--quota-mib"), "{err}");
}

#[test]
fn help_lists_every_subcommand() {
    let out = vtism(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for c in ["host", "ctl", "guest", "sim", "testbed", "demo"] {
        assert!(help.contains(&format!("  {c}")), "{c} missing from --help");
    }
}
