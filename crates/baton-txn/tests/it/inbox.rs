//! The consumer inbox against a real PostgreSQL.

use std::time::Duration;

use crate::common::{connect, fresh_schema};
use baton_txn::pg::Inbox;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_dropped_and_consumers_are_independent() {
    let schema = fresh_schema("t_inbox_dups").await;
    let inbox = Inbox::new(&schema);
    let mut client = connect().await;

    let tx = client.transaction().await.unwrap();
    assert!(inbox.first_time(&tx, "billing", "m1").await.unwrap());
    assert!(
        !inbox.first_time(&tx, "billing", "m1").await.unwrap(),
        "same transaction"
    );
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    assert!(
        !inbox.first_time(&tx, "billing", "m1").await.unwrap(),
        "redelivery"
    );
    assert!(
        inbox.first_time(&tx, "shipping", "m1").await.unwrap(),
        "another consumer"
    );
    tx.commit().await.unwrap();

    // A consumer that crashed (rolled back) never saw the message: the redelivery applies it.
    let tx = client.transaction().await.unwrap();
    assert!(inbox.first_time(&tx, "billing", "m2").await.unwrap());
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    assert!(inbox.first_time(&tx, "billing", "m2").await.unwrap());
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_waits_for_the_first_outcome() {
    let schema = fresh_schema("t_inbox_race").await;
    let inbox = Inbox::new(&schema);
    for first_commits in [true, false] {
        let id = format!("m-{first_commits}");
        let mut first = connect().await;
        let tx1 = first.transaction().await.unwrap();
        assert!(inbox.first_time(&tx1, "c", &id).await.unwrap());
        let second = {
            let (inbox, id) = (inbox.clone(), id.clone());
            tokio::spawn(async move {
                let mut client = connect().await;
                let tx2 = client.transaction().await.unwrap();
                let seen = inbox.first_time(&tx2, "c", &id).await.unwrap();
                tx2.commit().await.unwrap();
                seen
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the duplicate must wait on the first transaction"
        );
        if first_commits {
            tx1.commit().await.unwrap();
        } else {
            tx1.rollback().await.unwrap();
        }
        let second_first_time = second.await.unwrap();
        assert_eq!(second_first_time, !first_commits);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_forgets_old_messages() {
    let schema = fresh_schema("t_inbox_purge").await;
    let inbox = Inbox::new(&schema);
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    for id in ["a", "b", "c"] {
        assert!(inbox.first_time(&tx, "c", id).await.unwrap());
    }
    tx.commit().await.unwrap();
    assert_eq!(
        inbox
            .purge(&client, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tx = client.transaction().await.unwrap();
    assert!(inbox.first_time(&tx, "c", "d").await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(
        inbox
            .purge(&client, Duration::from_millis(200))
            .await
            .unwrap(),
        3
    );
    let tx = client.transaction().await.unwrap();
    assert!(
        !inbox.first_time(&tx, "c", "d").await.unwrap(),
        "young rows stay"
    );
    assert!(
        inbox.first_time(&tx, "c", "a").await.unwrap(),
        "purged rows are forgotten"
    );
    tx.commit().await.unwrap();
}
