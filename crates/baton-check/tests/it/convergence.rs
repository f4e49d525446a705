//! The convergence checkers on agreeing and diverging replicas.

use baton_check::{check_convergence, check_hash_agreement, ConvergenceError, ReplicaState};

fn rs(replica: u64, applied_index: u64, state_hash: u64) -> ReplicaState {
    ReplicaState {
        replica,
        applied_index,
        state_hash,
    }
}

#[test]
fn identical_replicas_converge() {
    assert_eq!(
        check_convergence(&[rs(1, 40, 0xabc), rs(2, 40, 0xabc), rs(3, 40, 0xabc)]),
        Ok((40, 0xabc))
    );
}

#[test]
fn a_lagging_replica_is_reported_by_index() {
    let e = check_convergence(&[rs(1, 40, 1), rs(2, 38, 2), rs(3, 40, 1)]).unwrap_err();
    assert_eq!(
        e,
        ConvergenceError::IndexMismatch(vec![(38, vec![2]), (40, vec![1, 3])])
    );
    assert_eq!(
        e.to_string(),
        "replicas did not converge to one applied index: index 38 on replicas [2]; index 40 on replicas [1, 3]"
    );
}

#[test]
fn divergent_state_at_the_same_index_is_reported() {
    let e = check_convergence(&[rs(1, 40, 7), rs(2, 40, 7), rs(3, 40, 9)]).unwrap_err();
    assert_eq!(
        e,
        ConvergenceError::HashMismatch {
            index: 40,
            groups: vec![(7, vec![1, 2]), (9, vec![3])]
        }
    );
    assert!(e
        .to_string()
        .starts_with("replicas diverged at applied index 40"));
}

#[test]
fn harness_mistakes_are_not_success() {
    assert_eq!(check_convergence(&[]), Err(ConvergenceError::NoReplicas));
    assert_eq!(
        check_convergence(&[rs(1, 4, 1), rs(1, 4, 1)]),
        Err(ConvergenceError::DuplicateReplica(1))
    );
    assert_eq!(check_hash_agreement(&[]), Err(ConvergenceError::NoReplicas));
}

#[test]
fn samples_at_common_indexes_must_agree() {
    // Replicas sampled over time at different indexes: compare where they overlap.
    let samples = [
        rs(1, 10, 100),
        rs(2, 10, 100),
        rs(1, 20, 200),
        rs(3, 20, 200),
        rs(3, 30, 300),
    ];
    assert_eq!(check_hash_agreement(&samples), Ok(2));
    let mut bad = samples.to_vec();
    bad.push(rs(2, 20, 201));
    assert_eq!(
        check_hash_agreement(&bad),
        Err(ConvergenceError::HashMismatch {
            index: 20,
            groups: vec![(200, vec![1, 3]), (201, vec![2])]
        })
    );
}
