//! Every query of the Grafana dashboard (packaging/grafana-vtism-host.json) names metrics, and
//! label matchers, that vtismd really serves: the daemon runs here against a fake QEMU monitor
//! (tests/common) with good and rejected hint rounds and a plan for the mover, and its /metrics
//! endpoint is scraped over HTTP like Prometheus does. Only the text exposition is read, so the
//! check holds whatever library renders it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vtism_host::channel_file::ChannelFile;
use vtism_host::config::Config;
use vtism_host::daemon::Daemon;
use vtism_proto::{ChannelWriter, Gfn, HintEntry, PageType, RoundMeta, Tracker};

mod common;
use common::{daemon_sections, fake_qemu, RAM_FRAMES};

const DASHBOARD: &str = include_str!("../../../packaging/grafana-vtism-host.json");
/// Labels Prometheus adds when it scrapes, not the exporter.
const SCRAPE_LABELS: [&str; 2] = ["instance", "job"];

/// The label names of a label set or selector body (`a="x",b!~"y"`), with values quoted and
/// escaped as in the exposition format and PromQL; returns the rest after the closing brace.
fn label_names(body: &str) -> (Vec<String>, &str) {
    let mut names = Vec::new();
    let mut rest = body;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return (names, after);
        }
        let op = rest.find(['=', '!']).expect("a label matcher");
        names.push(rest[..op].trim().to_string());
        let open = rest.find('"').expect("a quoted label value");
        let mut escaped = false;
        let close = rest[open + 1..]
            .char_indices()
            .find(|&(_, c)| {
                let end = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                end
            })
            .expect("a closed label value")
            .0;
        rest = &rest[open + 1 + close + 1..];
    }
}

/// Metric name -> the label names its samples carry, from a text exposition.
fn served(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = m.entry(line[..end].to_string()).or_default();
        if let Some(body) = line[end..].strip_prefix('{') {
            labels.extend(label_names(body).0);
        }
    }
    m
}

/// Every PromQL string in the dashboard: panel targets and template variable queries.
fn queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                match x {
                    serde_json::Value::String(s) if k == "expr" || k == "definition" => {
                        out.push(s.clone())
                    }
                    serde_json::Value::String(s) if k == "query" && s.contains("vtism_") => {
                        out.push(s.clone())
                    }
                    _ => queries(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| queries(x, out)),
        _ => {}
    }
}

/// The `vtism_*` selectors of a query: metric name and the label names of its matchers.
fn selectors(q: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = q;
    while let Some(i) = rest.find("vtism_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        rest = &tail[end..];
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            (labels, rest) = label_names(body);
        }
        out.push((name, labels));
    }
    out
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn selectors_are_parsed() {
    let q = r#"sum by (dir) (rate(vtism_a_total{instance=~"$i", dir!="x,}"}[5m])) / vtism_b"#;
    assert_eq!(
        selectors(q),
        vec![
            (
                "vtism_a_total".into(),
                vec!["instance".into(), "dir".into()]
            ),
            ("vtism_b".into(), vec![])
        ]
    );
    let m = served("# TYPE x counter\nvtism_a_total{vm=\"a,\\\"b=\",dir=\"p\"} 1\nvtism_b 2\n");
    assert_eq!(m["vtism_a_total"].len(), 2, "{m:?}");
    assert!(m["vtism_b"].is_empty());
}

#[test]
fn every_dashboard_query_names_served_metrics() {
    let dir = common::shm_test_dir("grafana");
    let chan = dir.join("fake.chan");
    std::fs::File::create(&chan)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut ram = vec![7u8; (RAM_FRAMES as usize + 1) * 4096];
    let hva = (ram.as_mut_ptr() as u64 + 4095) & !4095;
    let stop = Arc::new(AtomicBool::new(false));
    let server = fake_qemu(
        dir.join("qmp/fake.qmp"),
        "fake",
        chan.clone(),
        hva,
        1,
        stop.clone(),
    );
    // Pool mode and move limits, so that every family the dashboard draws has samples.
    let cfg = daemon_sections(&dir, 200)
        .replace("metrics_listen = \"\"", "metrics_listen = \"127.0.0.1:0\"")
        + r#"
[mover]
promote_mbps = 100
vm_demote_mbps = 50
[pool]
mode = "pool"
fast_mib = 4
[[vm]]
name = "fake"
fast_quota_mib = 1
"#;
    let mut d = Daemon::new(Config::parse(&cfg).unwrap(), None).unwrap();
    let addr = d.metrics_addr.expect("the metrics endpoint is up");

    let map = ChannelFile::open(&chan, 1 << 20, None).unwrap();
    let region = map.region();
    let mut w = ChannelWriter::init(&region, Tracker::Harness).unwrap();
    let hot: Vec<HintEntry> = (0..64)
        .map(|g| HintEntry::new(Gfn(g), 8, false, PageType::Anon, false, true))
        .collect();
    let bad = [HintEntry::new(
        Gfn(RAM_FRAMES + 5),
        8,
        false,
        PageType::Anon,
        false,
        true,
    )];
    let mut text = String::new();
    for i in 0..100 {
        let entries: &[HintEntry] = if i == 3 { &bad } else { &hot };
        w.publish(entries, &RoundMeta::default()).unwrap();
        d.round();
        std::thread::sleep(Duration::from_millis(20));
        text = scrape(addr);
        let m = served(&text);
        // Histogram families are served empty from the start: wait for the first finished
        // plan's page counts too, which a loaded machine can take more rounds to produce.
        if i > 5
            && m.contains_key("vtism_mover_plan_seconds_bucket")
            && m.contains_key("vtism_hint_rounds_rejected_total")
            && m.contains_key("vtism_vm_pages_total")
        {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    server.join().unwrap();
    d.shutdown();
    drop(ram);
    let _ = std::fs::remove_dir_all(&dir);

    let have = served(&text);
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut qs = Vec::new();
    queries(&dashboard, &mut qs);
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for q in &qs {
        for (name, labels) in selectors(q) {
            used.insert(name.clone());
            let Some(served_labels) = have.get(&name) else {
                problems.push(format!("{name} is not served (query: {q})"));
                continue;
            };
            for l in labels
                .iter()
                .filter(|l| !SCRAPE_LABELS.contains(&l.as_str()))
            {
                if !served_labels.contains(l) {
                    problems.push(format!("{name} has no label {l} (query: {q})"));
                }
            }
        }
    }
    assert!(
        used.len() >= 20,
        "only {} metrics queried: {used:?}",
        used.len()
    );
    assert!(
        problems.is_empty(),
        "{}\n--- served:\n{text}",
        problems.join("\n")
    );
}
