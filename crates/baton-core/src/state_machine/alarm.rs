//! Alarms (etcd's alarm store): raised and cleared per member by `Command::Alarm`,
//! replicated and kept in snapshots. A raised `NoSpace` alarm makes `apply` refuse every
//! command that adds data ([`Command::adds_data`](crate::Command::adds_data)), a raised
//! `Corrupt` alarm every command that changes keys or leases by request
//! ([`Command::refused_while_corrupt`](crate::Command::refused_while_corrupt)), on every
//! replica alike: the alarm list is replicated state, so the refusal is deterministic.

use crate::command::{AlarmAction, AlarmType, Response};

use super::store::StateMachine;

impl StateMachine {
    pub(super) fn apply_alarm(
        &mut self,
        action: AlarmAction,
        member_id: u64,
        alarm: AlarmType,
    ) -> Response {
        let member = (member_id, alarm);
        let changed = match action {
            AlarmAction::Activate => self.alarms.insert(member),
            AlarmAction::Deactivate => self.alarms.remove(&member),
        };
        Response::Alarm {
            changed: changed.then_some(member),
        }
    }

    /// Raised alarms as `(member id, alarm)`, in member order (etcd's `AlarmStore.Get`).
    pub fn alarms(&self) -> Vec<(u64, AlarmType)> {
        self.alarms.iter().copied().collect()
    }

    /// Whether a `NoSpace` alarm is raised for any member: commands that add data are
    /// refused ([`Command::adds_data`](crate::Command::adds_data)).
    pub fn no_space(&self) -> bool {
        self.alarms.iter().any(|(_, a)| *a == AlarmType::NoSpace)
    }

    /// Whether a `Corrupt` alarm is raised for any member: commands that change keys or
    /// leases by request are refused
    /// ([`Command::refused_while_corrupt`](crate::Command::refused_while_corrupt)).
    pub fn corrupt(&self) -> bool {
        self.alarms.iter().any(|(_, a)| *a == AlarmType::Corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{
        Command, DeleteRangeRequest, KvError, PutRequest, RangeRequest, RequestOp, TxnRequest,
    };
    use crate::state_machine::tests::{enqueue, entry, put};
    use crate::types::{KeyRange, LeaseId};

    fn alarm(action: AlarmAction, member_id: u64) -> Command {
        Command::Alarm {
            action,
            member_id,
            alarm: AlarmType::NoSpace,
        }
    }

    /// The NOSPACE alarm refuses exactly what adds data, changes nothing when it refuses,
    /// and lets deletes, compaction and revokes through; clearing it lets writes in again.
    #[test]
    fn no_space_alarm_refuses_what_adds_data_only() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        sm.apply(&entry(
            2,
            Command::LeaseGrant {
                id: LeaseId(7),
                ttl_s: 60,
            },
        ));
        let raised = sm.apply(&entry(3, alarm(AlarmAction::Activate, 42)));
        assert_eq!(
            raised.response,
            Response::Alarm {
                changed: Some((42, AlarmType::NoSpace))
            }
        );
        assert!(raised.events.is_empty(), "an alarm is no revision");
        assert_eq!(sm.alarms(), vec![(42, AlarmType::NoSpace)]);
        // Raising it twice changes nothing.
        let again = sm.apply(&entry(4, alarm(AlarmAction::Activate, 42)));
        assert_eq!(again.response, Response::Alarm { changed: None });

        let before = sm.hash_kv(0).unwrap();
        let txn_with_put = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: Vec::new(),
            failure: vec![RequestOp::Txn(TxnRequest {
                compare: Vec::new(),
                success: vec![RequestOp::Put(PutRequest {
                    key: b"n".to_vec(),
                    ..Default::default()
                })],
                failure: Vec::new(),
            })],
        });
        let refused = [
            put("b", "2"),
            txn_with_put,
            Command::LeaseGrant {
                id: LeaseId(8),
                ttl_s: 60,
            },
            enqueue("lock", 7),
            Command::RegisterClient { timeout_ms: 60_000 },
            Command::Deduplicated {
                client_id: 1,
                sequence: 1,
                acknowledged_below: 0,
                command: Box::new(put("c", "3")),
            },
        ];
        for (i, cmd) in refused.into_iter().enumerate() {
            assert!(cmd.adds_data(), "{cmd:?}");
            let a = sm.apply(&entry(10 + i as u64, cmd));
            assert_eq!(a.response, Response::Error(KvError::NoSpace));
            assert!(a.events.is_empty());
        }
        assert_eq!(sm.hash_kv(0).unwrap(), before, "refusals changed nothing");
        assert_eq!(sm.client_sessions(), 0);
        assert_eq!(sm.lease_ids(), vec![LeaseId(7)]);

        // A read-only txn, deletes, compaction and revokes go through.
        let read_txn = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Range(RangeRequest {
                range: KeyRange {
                    key: b"a".to_vec(),
                    range_end: Vec::new(),
                },
                ..Default::default()
            })],
            failure: Vec::new(),
        });
        assert!(!read_txn.adds_data());
        assert!(matches!(
            sm.apply(&entry(20, read_txn)).response,
            Response::Txn(_)
        ));
        let del = sm.apply(&entry(
            21,
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"a".to_vec(),
                    range_end: Vec::new(),
                },
                prev_kv: false,
            }),
        ));
        assert!(matches!(del.response, Response::DeleteRange(ref d) if d.deleted == 1));
        let rev = sm.revision();
        assert_eq!(
            sm.apply(&entry(22, Command::Compact { revision: rev }))
                .response,
            Response::Compact
        );
        assert_eq!(
            sm.apply(&entry(23, Command::LeaseRevoke { id: LeaseId(7) }))
                .response,
            Response::LeaseRevoke
        );

        // The alarm survives a snapshot, and clearing it lets writes in again.
        let mut sm = StateMachine::restore(&sm.snapshot()).expect("restores");
        assert!(sm.no_space());
        let other = sm.apply(&entry(24, alarm(AlarmAction::Deactivate, 41)));
        assert_eq!(other.response, Response::Alarm { changed: None });
        assert!(sm.no_space(), "another member's alarm is not this one");
        let cleared = sm.apply(&entry(25, alarm(AlarmAction::Deactivate, 42)));
        assert_eq!(
            cleared.response,
            Response::Alarm {
                changed: Some((42, AlarmType::NoSpace))
            }
        );
        assert!(!sm.no_space());
        assert!(matches!(
            sm.apply(&entry(26, put("b", "2"))).response,
            Response::Put(_)
        ));
    }
    /// CORRUPT refuses what etcd's corrupt applier refuses (writes, compaction, lease
    /// grant and revoke) plus Baton's lock writes, changes nothing when it refuses, and
    /// serves read-only txns; clearing it lets writes in again.
    #[test]
    fn corrupt_alarm_refuses_key_space_and_lease_changes_only() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        sm.apply(&entry(
            2,
            Command::LeaseGrant {
                id: LeaseId(7),
                ttl_s: 60,
            },
        ));
        let corrupt = |action| Command::Alarm {
            action,
            member_id: 42,
            alarm: AlarmType::Corrupt,
        };
        let raised = sm.apply(&entry(3, corrupt(AlarmAction::Activate)));
        assert_eq!(
            raised.response,
            Response::Alarm {
                changed: Some((42, AlarmType::Corrupt))
            }
        );
        assert!(sm.corrupt() && !sm.no_space());
        let before = sm.hash_kv(0).unwrap();
        let rev = sm.revision();
        let key = |k: &str| KeyRange {
            key: k.as_bytes().to_vec(),
            range_end: Vec::new(),
        };
        let refused = [
            put("b", "2"),
            Command::DeleteRange(DeleteRangeRequest {
                range: key("a"),
                prev_kv: false,
            }),
            Command::Txn(TxnRequest {
                compare: Vec::new(),
                success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                    range: key("a"),
                    prev_kv: false,
                })],
                failure: Vec::new(),
            }),
            Command::Compact { revision: rev },
            Command::LeaseGrant {
                id: LeaseId(8),
                ttl_s: 60,
            },
            Command::LeaseRevoke { id: LeaseId(7) },
            enqueue("lock", 7),
        ];
        for (i, cmd) in refused.into_iter().enumerate() {
            assert!(cmd.refused_while_corrupt(), "{cmd:?}");
            let a = sm.apply(&entry(10 + i as u64, cmd));
            assert_eq!(a.response, Response::Error(KvError::Corrupt));
            assert!(a.events.is_empty());
        }
        assert_eq!(sm.hash_kv(0).unwrap(), before, "refusals changed nothing");
        assert_eq!(sm.lease_ids(), vec![LeaseId(7)]);
        let read_txn = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Range(RangeRequest {
                range: key("a"),
                ..Default::default()
            })],
            failure: Vec::new(),
        });
        assert!(!read_txn.refused_while_corrupt());
        assert!(matches!(
            sm.apply(&entry(20, read_txn)).response,
            Response::Txn(_)
        ));
        // Survives a snapshot; clearing it lets writes in again.
        let mut sm = StateMachine::restore(&sm.snapshot()).expect("restores");
        assert!(sm.corrupt());
        sm.apply(&entry(21, corrupt(AlarmAction::Deactivate)));
        assert!(!sm.corrupt());
        assert!(matches!(
            sm.apply(&entry(22, put("b", "2"))).response,
            Response::Put(_)
        ));
    }
}
