//! `deploy/local/demo.sh` run as a person would: it starts, serves the example routes
//! through both proxies, answers the grpcurl commands it prints, survives what it invites
//! (killing the control plane: the proxies keep serving, the printed command starts it
//! again, and a new Ingress then reaches the proxies), and exits cleanly on SIGTERM,
//! leaving no process behind and the logs of what exited.

use std::path::Path;
use std::process::{Command, Stdio};

use holdfast_tests::wait::{self, T};

#[test]
fn the_demo_serves_the_examples_answers_its_grpcurl_commands_survives_a_killed_control_plane_and_exits_cleanly()
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
    let text = // Two deadlines: the demo starts a cluster, two test hosts and five processes.
    wait::until_blocking("the demo to be ready", 2 * T, || {
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
    // The Gateway: its HTTPRoute through the Gateway's own address; the header match
    // takes the canary to api (echo-b only).
    let gateway = run(curls
        .iter()
        .find(|c| c.contains("gateway.demo.test") && !c.contains("x-canary"))
        .unwrap())?;
    assert!(gateway.starts_with("echo-"), "{gateway}");
    let canary = run(curls.iter().find(|c| c.contains("x-canary")).unwrap())?;
    assert_eq!(canary.trim(), "echo-b");
    let get_gateway = commands
        .iter()
        .find(|c| c.contains("get gateway"))
        .expect("the demo prints how to see its Gateway");
    wait::until_blocking("the demo's Gateway to be programmed", T, || {
        let out = run(get_gateway).map_err(|e| e.to_string())?;
        Ok(out.contains("True").then_some(()))
    })?;

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
    let ingresses = run(commands
        .iter()
        .find(|c| c.starts_with("kubectl get ingress"))
        .unwrap())?;
    assert!(ingresses.contains("shop.demo.test"), "{ingresses}");

    let dir = text
        .split_whitespace()
        .find_map(|w| w.strip_suffix("/*.log."))
        .expect("the demo says where its logs are")
        .to_string();
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

    // Kill the control plane, as the demo invites: the proxies keep serving, and the demo
    // keeps running.
    let control_plane = pids[2];
    assert!(
        Command::new("kill")
            .args(["-s", "KILL", &control_plane.to_string()])
            .status()?
            .success()
    );
    wait::until_blocking("the control plane to be gone", T, || {
        Ok((!Path::new(&format!("/proc/{control_plane}")).exists()).then_some(()))
    })?;
    for c in curls.iter().filter(|c| c.contains("web.demo.test")) {
        let served = run(c)?;
        assert!(
            served.starts_with("echo-"),
            "with the control plane down: {served}"
        );
    }
    // Start it again with the command the demo printed; a new Ingress then reaches both
    // proxies, which only a running control plane can deliver.
    let restart = commands
        .iter()
        .find(|c| c.starts_with("kill -USR1 "))
        .expect("the demo prints how to start what exited again");
    run(restart)?;
    run("kubectl -n demo create ingress late --class holdfast --rule 'late.demo.test/*=web:80'")?;
    let late: Vec<String> = curls
        .iter()
        .filter(|c| c.contains("web.demo.test") && c.contains("http://"))
        .map(|c| c.replace("web.demo.test", "late.demo.test"))
        .collect();
    assert_eq!(late.len(), 2);
    for c in &late {
        wait::until_blocking("the new Ingress to reach the proxy", T, || {
            Ok(run(c).ok().filter(|b| b.starts_with("echo-")))
        })?;
    }
    assert!(demo.try_wait()?.is_none(), "the demo is still running");

    // SIGTERM (a signal a background job cannot have ignored on entry, unlike SIGINT):
    // clean exit, nothing left, and the logs kept because the control plane was killed.
    let ok = Command::new("kill")
        .args(["-s", "TERM", &demo.id().to_string()])
        .status()?
        .success();
    assert!(ok);
    let status = wait::until_blocking("the demo to exit", T, || {
        demo.try_wait().map_err(|e| e.to_string())
    })?;
    assert!(status.success(), "demo exited with {status}");
    for pid in pids {
        wait::until_blocking(&format!("process {pid} to be gone"), T, || {
            Ok((!Path::new(&format!("/proc/{pid}")).exists()).then_some(()))
        })?;
    }
    // The restarted control plane too: no process refers to the demo's directory.
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}");
    let netns = Command::new("ip").args(["netns", "list"]).output()?;
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&format!("hf-{}-demo", demo.id())));
    let log = Path::new(&dir).join("control-plane.log");
    assert!(
        log.exists(),
        "{} kept after the control plane was killed",
        log.display()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The scripts (demo, benchmarks, the test command) find the binaries where cargo puts
/// them, also when `CARGO_TARGET_DIR` moves them out of the repository.
#[test]
fn the_scripts_find_the_binaries_where_cargo_puts_them() -> anyhow::Result<()> {
    let script = holdfast_tests::repo_root().join("deploy/local/target-dir.sh");
    let dir = |target: Option<&str>| -> anyhow::Result<String> {
        let mut c = Command::new("bash");
        c.arg(&script).env_remove("CARGO_TARGET_DIR");
        if let Some(t) = target {
            c.env("CARGO_TARGET_DIR", t);
        }
        let o = c.output()?;
        anyhow::ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let elsewhere = tempfile::tempdir()?;
    let elsewhere = elsewhere.path().to_string_lossy().into_owned();
    assert_eq!(dir(Some(&elsewhere))?, elsewhere);
    // Without the variable: where cargo put this test binary (<target>/debug/deps/), be
    // that target/ or a build.target-dir of the user's cargo configuration.
    let exe = std::env::current_exe()?;
    let target = exe
        .ancestors()
        .nth(3)
        .ok_or_else(|| anyhow::anyhow!("{exe:?} is not in <target>/debug/deps"))?;
    assert_eq!(
        std::fs::canonicalize(dir(None)?)?,
        std::fs::canonicalize(target)?
    );
    Ok(())
}
