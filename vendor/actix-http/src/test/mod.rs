//! Various testing helpers for use in internal and app tests.

#[cfg(test)]
pub(crate) mod pending_once_write_buf;
#[cfg(test)]
mod ready_chunk_body;
mod test_buffer;
mod test_request;
mod test_seq_buffer;
#[cfg(test)]
pub(crate) mod test_services;

pub use self::{
    test_buffer::TestBuffer,
    test_request::TestRequest,
    test_seq_buffer::{TestSeqBuffer, TestSeqInner},
};
