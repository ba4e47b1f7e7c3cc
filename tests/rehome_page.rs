//! The idle-rehome worker's page read (docs/reference/http.md: "reads one page (≤ 50 hosts) … continuing
//! after the last key of the previous poll and wrapping at the end") on SQLite and (when
//! configured) Postgres: `store::region::candidate_page` with its after/through bounds and
//! `rehome::service::candidate_page`, which fills a short read after the cursor from the first key
//! so each poll sees a full page of distinct hosts. The pure join is unit-tested in
//! `src/rehome/rules.rs`.

use orca_relay::director::assign::{assign, AssignOptions};
use orca_relay::model::Admission;
use orca_relay::rehome::rules::{Report, ReportOutcome, ReportStatus};
use orca_relay::rehome::service;
use orca_relay::store::assignments::HostKey;
use orca_relay::store::cells::{self, Beat, CellSpec};
use orca_relay::store::testing::backends;
use orca_relay::store::{region, Db};

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";

fn regions() -> Vec<String> {
    vec![US.into(), ASIA.into()]
}

fn now() -> i64 {
    orca_relay::clock::now_ms()
}

fn host(n: u32) -> HostKey {
    HostKey {
        user_id: format!("user-{n:02}"),
        relay_host_id: format!("hostid{n:010}"),
    }
}

/// Cell A (us) and `n` hosts on it, each with an accepted report; `prefer_other(i)` decides
/// whether host i's RTTs prefer asia (a candidate row) or stay with us (no preferred region).
async fn fixture(db: &Db, n: u32, prefer_other: impl Fn(u32) -> bool) {
    cells::upsert_all(
        db,
        &[CellSpec {
            cell_id: "A".into(),
            cell_url: "https://a.cells.test".into(),
            region: US.into(),
            capacity_requests: 900,
            cap_and_bound: None,
            initial_state: Admission::General,
        }],
        now(),
    )
    .await
    .unwrap();
    // A live cell (one heartbeat) so placement admits the hosts.
    orca_relay::director::heartbeat::apply(
        db,
        &Beat {
            cell_id: "A".into(),
            cell_url: "https://a.cells.test".into(),
            region: US.into(),
            cell_incarnation: "00000000-0000-4000-8000-00000000000a".into(),
            started_at: 1,
            ready: true,
            observed_requests: 0,
            telemetry: None,
        },
        now(),
    )
    .await
    .unwrap();
    for i in 1..=n {
        let h = host(i);
        let g = assign(db, &h, Some(US), &regions(), AssignOptions::default())
            .await
            .unwrap();
        let w = service::issue_window(db, &h, g.assignment_epoch, US, now())
            .await
            .unwrap();
        let asia = if prefer_other(i) { 40 } else { 150 };
        let (st, _) = service::report(
            db,
            &h,
            &Report {
                generation: w["generation"].as_i64().unwrap(),
                assignment_epoch: g.assignment_epoch,
                policy_version: 1,
                outcome: ReportOutcome::Conclusive(vec![(US.into(), 150), (ASIA.into(), asia)]),
            },
            &regions(),
            now(),
        )
        .await
        .unwrap();
        assert_eq!(st, ReportStatus::Accepted);
    }
}

fn numbers(page: &[region::PageHost]) -> Vec<u32> {
    page.iter()
        .map(|p| p.host.user_id["user-".len()..].parse().unwrap())
        .collect()
}

/// The bounded read: after (exclusive), through (inclusive), limit, key order; hosts without a
/// preference for another region are not rows of the page.
#[tokio::test]
async fn candidate_page_reads_between_bounds_in_key_order() {
    for t in backends().await {
        let db = &t.db;
        // Host 4 prefers its own region: never on a page.
        fixture(db, 7, |i| i != 4).await;
        let read = |after: Option<u32>, through: Option<u32>, limit: i64| async move {
            let (a, th) = (after.map(host), through.map(host));
            numbers(
                &region::candidate_page(db, a.as_ref(), th.as_ref(), limit)
                    .await
                    .unwrap(),
            )
        };
        assert_eq!(
            read(None, None, 50).await,
            vec![1, 2, 3, 5, 6, 7],
            "{:?}",
            t.kind()
        );
        assert_eq!(read(None, None, 2).await, vec![1, 2]);
        assert_eq!(read(Some(2), None, 50).await, vec![3, 5, 6, 7]);
        assert_eq!(read(Some(7), None, 50).await, Vec::<u32>::new());
        assert_eq!(
            read(None, Some(3), 50).await,
            vec![1, 2, 3],
            "through is inclusive"
        );
        assert_eq!(read(None, Some(4), 50).await, vec![1, 2, 3]);
        assert_eq!(read(Some(1), Some(6), 2).await, vec![2, 3]);
        let page = region::candidate_page(db, None, None, 1).await.unwrap();
        assert_eq!(page[0].cell_id, "A");
        assert_eq!(page[0].decision.preferred_region.as_deref(), Some(ASIA));
        assert_eq!(page[0].decision.incumbent_region, US);
    }
}

/// Polls with a page of 4 over 6 candidate rows: every page holds 4 distinct hosts, a short read
/// after the cursor is filled from the first key, and the cursor walks on from the page's last
/// key; with fewer rows than a page every poll reads them all once.
#[tokio::test]
async fn wrapping_pages_are_full_and_distinct() {
    for t in backends().await {
        let db = &t.db;
        fixture(db, 7, |i| i != 4).await;
        let mut cursor = None;
        let mut pages = Vec::new();
        for _ in 0..4 {
            let (page, next) = service::candidate_page(db, cursor.as_ref(), 4)
                .await
                .unwrap();
            pages.push(numbers(&page));
            cursor = next;
        }
        assert_eq!(
            pages,
            vec![
                vec![1, 2, 3, 5],
                vec![6, 7, 1, 2],
                vec![3, 5, 6, 7],
                vec![1, 2, 3, 5],
            ],
            "{:?}",
            t.kind()
        );
        // A page larger than the candidate set: all of them, no repeats, no cursor kept.
        let (page, next) = service::candidate_page(db, Some(&host(5)), 50)
            .await
            .unwrap();
        assert_eq!(numbers(&page), vec![6, 7, 1, 2, 3, 5]);
        assert_eq!(next, None);
        let (page, next) = service::candidate_page(db, None, 50).await.unwrap();
        assert_eq!(numbers(&page), vec![1, 2, 3, 5, 6, 7]);
        assert_eq!(next, None);
        // The cursor host itself no longer a row (moved, decision gone): the wrap still stops
        // at the cursor key and the page stays distinct.
        let (page, _) = service::candidate_page(db, Some(&host(4)), 4)
            .await
            .unwrap();
        assert_eq!(numbers(&page), vec![5, 6, 7, 1]);
    }
}
