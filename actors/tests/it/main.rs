//! The actors' integration tests, one binary: the cluster seam's behavioural suite on both
//! stores (`cluster`), idle relays (`idle`), a channel's full mailbox (`mailbox`) and storage
//! faults (`store_faults`).

mod cluster;
mod idle;
mod mailbox;
mod store_faults;
