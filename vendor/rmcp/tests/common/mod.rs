pub mod calculator;
pub mod handlers;
