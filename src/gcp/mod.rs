//! Thin REST clients for Google Cloud APIs (reqwest with rustls; tokens from Application
//! Default Credentials through `gcp_auth`; an emulator endpoint needs none). They speak the
//! APIs' JSON shapes and must not know the engine's types.

pub mod discovery;
pub mod firestore;
pub mod http;
pub mod storage;
pub mod tpu;
