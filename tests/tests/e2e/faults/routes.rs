//! Route changes under traffic: one Ingress of ten deleted, and a Service deleted while
//! its Ingress stays (503, never 404).

use std::time::{Duration, Instant};

use holdfast_tests::objects::delete;
use holdfast_tests::scenario::{Options, Scenario, T};
use holdfast_tests::wait;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::Ingress;

use super::*;

#[tokio::test]
async fn s11_deleting_one_of_ten_ingresses_flows_within_2s_and_others_never_fail()
-> anyhow::Result<()> {
    let s = Scenario::start("s11", Options::default()).await?;
    let traffic = s.traffic(RATE);
    let gone = s.host(3);
    let deleted = Instant::now();
    delete::<Ingress>(&s.client, &s.ns, "app3").await?;
    for p in &s.proxies {
        wait::until(
            "the deleted host to answer 404",
            Duration::from_secs(5),
            || async { Ok(matches!(p.get(&gone, "/").await, Ok((404, _))).then_some(())) },
        )
        .await?;
    }
    let took = deleted.elapsed();
    eprintln!("deletion reached both proxies in {took:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 800).then_some(()))
    })
    .await?;
    let report = traffic.stop().await?;
    let others = report.unexpected_except(&[&gone]);
    assert!(
        others.is_empty(),
        "other hosts failed: {}",
        report.summary()
    );
    assert!(
        report.unexpected.iter().all(|u| u.status == 404),
        "{}",
        report.summary()
    );
    Ok(())
}

#[tokio::test]
async fn s12_service_deleted_while_its_ingress_stays_answers_503_not_404() -> anyhow::Result<()> {
    let s = Scenario::start("s12", Options::default()).await?;
    let traffic = s.traffic(RATE);
    let host = s.host(4);
    delete::<Service>(&s.client, &s.ns, "app4").await?;
    for p in &s.proxies {
        wait::until("503 for the Service-less route", T, || async {
            Ok(matches!(p.get(&host, "/").await, Ok((503, _))).then_some(()))
        })
        .await?;
    }
    wait::until("more traffic", T, || async {
        Ok((traffic.snapshot().total > 800).then_some(()))
    })
    .await?;
    let report = traffic.stop().await?;
    assert!(
        report.unexpected_except(&[&host]).is_empty(),
        "{}",
        report.summary()
    );
    assert_eq!(
        report.count(&host, 404),
        0,
        "the route was removed: {}",
        report.summary()
    );
    assert!(report.count(&host, 503) > 0);
    Ok(())
}
