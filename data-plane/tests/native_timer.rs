//! The native engine's waits share its connection's one timer ([`holdfast_http::h1::timer`]):
//! over 1,000 warm keep-alive requests, half of them POSTs whose bodies come after their
//! heads (so that reading the body waits), the waits that had to wait number at least one
//! per request while the timer is armed only a handful of times. The client, the proxy's
//! connection and the upstream run on one current-thread runtime, on real sockets on
//! 127.0.0.1. (`http/clippy.toml` keeps the engine's waits off `tokio::time::timeout`.)

use holdfast_http::h1::timer;

#[path = "../benches/common/native.rs"]
mod native;

#[test]
fn the_native_engines_waits_share_one_timer_armed_a_handful_of_times() {
    let (waits, arms) = std::thread::spawn(|| {
        let rt = native::runtime(true);
        rt.block_on(async {
            let (mut client, _f) = native::start().await;
            // A POST's head and body are two small writes: without this, the body would
            // wait for the head's ACK (Nagle), 40 ms each.
            client.set_nodelay(true).expect("nodelay");
            let mut buf = vec![0u8; 8192];
            for _ in 0..20 {
                native::exchange(&mut client, &mut buf).await;
                native::exchange_with_late_body(&mut client, &mut buf).await;
            }
            let (waits, arms) = timer::counts();
            for _ in 0..500 {
                native::exchange(&mut client, &mut buf).await;
                native::exchange_with_late_body(&mut client, &mut buf).await;
            }
            let (w, a) = timer::counts();
            (w - waits, a - arms)
        })
    })
    .join()
    .expect("the requests' thread");
    assert!(
        waits >= 1000,
        "at least one wait per request went through the connection's timer: {waits}"
    );
    assert!(
        arms <= 10,
        "the timer was armed {arms} times for {waits} waits over 1,000 requests"
    );
    eprintln!("1,000 requests: {waits} waits on the timer, armed {arms} times");
}
