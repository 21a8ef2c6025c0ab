//! The actors' integration tests, one binary: the cluster seam's behavioural suite on both
//! stores (`cluster`), idle relays (`idle`), the search indexer (`indexing`), a channel's full mailbox (`mailbox`) and storage
//! faults (`store_faults`).

#[path = "../../../tests/common/tmpfs.rs"]
mod tmpfs;

mod cluster;
mod full_disk;
mod idle;
mod indexing;
mod mailbox;
mod store_faults;
mod support;
