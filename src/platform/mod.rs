//! What every layer above may use and that decides nothing about a
//! PostgreSQL cluster: Kubernetes Events, the labels and annotations pgfleet
//! stamps on objects, the background-task guard, time (the clock and RFC 3339
//! text) and the one hash, the open-file limit. It sits just above the leaves (config, crd,
//! postgres) and uses nothing else; see docs/architecture.md, "Layers".

pub mod clock;
pub mod events;
pub mod hash;
pub mod labels;
pub mod limits;
pub mod memory;
pub mod objects;
pub mod small_map;
pub mod task;
pub mod time;
