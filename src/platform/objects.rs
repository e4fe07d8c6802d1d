//! Small constructors for the k8s-openapi structs pgfleet builds its
//! children from. The structs are mostly `Option`s with `Default`; these
//! keep the builders readable (one line per env var, mount, port) while the
//! compiler checks every field name the API server will see.

use k8s_openapi::api::core::v1::{
    ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// `{"name": n, "value": v}`.
pub fn env_value(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// An env var from the downward API (`fieldRef.fieldPath`).
pub fn env_field(name: &str, path: &str) -> EnvVar {
    env_from(
        name,
        EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        },
    )
}

/// An env var from a key of a Secret (credentials never go in the spec).
pub fn env_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    env_from(
        name,
        EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.into(),
                key: key.into(),
                ..SecretKeySelector::default()
            }),
            ..EnvVarSource::default()
        },
    )
}

fn env_from(name: &str, source: EnvVarSource) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(source),
        ..EnvVar::default()
    }
}

/// A volume mount (read-write unless `read_only`).
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// A named TCP container port.
pub fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

/// The metadata of a namespaced object with these labels.
pub fn meta(name: &str, namespace: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// Sets one annotation, creating the map when there is none.
pub fn annotate(meta: &mut ObjectMeta, key: &str, value: impl Into<String>) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
}
