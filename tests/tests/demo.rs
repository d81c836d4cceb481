//! `deploy/local/demo.sh` run as a person would: it starts, serves the example routes
//! through both proxies, answers the grpcurl commands it prints, and exits cleanly on
//! Ctrl-C, leaving no process behind.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use holdfast_tests::wait;

#[test]
fn the_demo_serves_the_examples_answers_its_grpcurl_commands_and_exits_cleanly()
-> anyhow::Result<()> {
    let out = holdfast_tests::repo_root().join("target/e2e-logs/demo.out");
    std::fs::create_dir_all(out.parent().unwrap())?;
    let mut demo = Command::new("bash")
        .arg(holdfast_tests::repo_root().join("deploy/local/demo.sh"))
        // `tests/run.sh` has just built the binaries.
        .env("HOLDFAST_DEMO_SKIP_BUILD", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(Stdio::inherit())
        .spawn()?;
    let text = wait::until_blocking("the demo to be ready", Duration::from_secs(120), || {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if let Ok(Some(status)) = demo.try_wait() {
            return Err(format!("demo exited early ({status}):\n{text}"));
        }
        Ok(text.contains("pids: ").then_some(text))
    })?;

    let commands: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("$ "))
        .collect();
    let export = commands
        .iter()
        .find(|c| c.starts_with("export "))
        .expect("an export line");
    let run = |cmd: &str| -> anyhow::Result<String> {
        let o = Command::new("bash")
            .arg("-c")
            .arg(format!("{export}; {cmd}"))
            .output()?;
        anyhow::ensure!(
            o.status.success(),
            "`{cmd}` failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let curls: Vec<&&str> = commands.iter().filter(|c| c.starts_with("curl")).collect();
    let web: Vec<String> = curls
        .iter()
        .filter(|c| c.contains("web.demo.test"))
        .map(|c| run(c))
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(web.len(), 2, "web through both proxies");
    assert!(web.iter().all(|b| b.starts_with("echo-")), "{web:?}");
    let api = run(curls.iter().find(|c| c.contains("/v1/users")).unwrap())?;
    assert_eq!(api.trim(), "echo-b");
    let health = run(curls.iter().find(|c| c.contains("/healthz")).unwrap())?;
    assert_eq!(health.trim(), "echo-a");
    let shop = run(curls.iter().find(|c| c.contains("shop.demo.test")).unwrap())?;
    assert!(shop.starts_with("HTTP/1.1 503"), "{shop}");
    // The demo runs with --verbose-errors: the page says why.
    assert!(shop.contains("service demo/shop not found"), "{shop}");
    let secure = run(curls
        .iter()
        .find(|c| c.contains("https://secure.demo.test"))
        .unwrap())?;
    assert!(secure.starts_with("echo-"), "{secure}");
    let redirect = run(curls
        .iter()
        .find(|c| c.contains("Host: secure.demo.test"))
        .unwrap())?;
    assert!(redirect.starts_with("HTTP/1.1 308"), "{redirect}");
    let explain = run(curls.iter().find(|c| c.contains("/debug/explain")).unwrap())?;
    assert!(explain.contains("\"matched\": true"), "{explain}");

    let grpcurls: Vec<&&str> = commands
        .iter()
        .filter(|c| c.starts_with("grpcurl"))
        .collect();
    assert!(
        grpcurls
            .iter()
            .all(|c| c.contains("-cert ") && !c.contains("-plaintext")),
        "{grpcurls:?}"
    );
    for cmd in grpcurls {
        let answer = run(cmd)?;
        assert!(!answer.trim().is_empty(), "`{cmd}` printed nothing");
    }
    let listed = run(commands.iter().find(|c| c.ends_with(" list")).unwrap())?;
    assert!(listed.contains("holdfast.v1.Admin"), "{listed}");
    let proxies = run(commands.iter().find(|c| c.contains("ListProxies")).unwrap())?;
    assert_eq!(proxies.matches("\"ackedVersion\"").count(), 2, "{proxies}");
    let ingresses = run(commands.iter().find(|c| c.starts_with("kubectl")).unwrap())?;
    assert!(ingresses.contains("shop.demo.test"), "{ingresses}");

    // Ctrl-C: clean exit, nothing left.
    let pids: Vec<u32> = text
        .lines()
        .find_map(|l| l.strip_prefix("pids: "))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(
        pids.len(),
        7,
        "2 echo, control plane, 2 proxies, etcd, kube-apiserver"
    );
    let ok = Command::new("kill")
        .args(["-s", "INT", &demo.id().to_string()])
        .status()?
        .success();
    assert!(ok);
    let status = wait::until_blocking("the demo to exit", Duration::from_secs(60), || {
        demo.try_wait().map_err(|e| e.to_string())
    })?;
    assert!(status.success(), "demo exited with {status}");
    for pid in pids {
        wait::until_blocking(
            &format!("process {pid} to be gone"),
            Duration::from_secs(10),
            || Ok((!Path::new(&format!("/proc/{pid}")).exists()).then_some(())),
        )?;
    }
    let netns = Command::new("ip").args(["netns", "list"]).output()?;
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&format!("hf-{}-demo", demo.id())));
    Ok(())
}
