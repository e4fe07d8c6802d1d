//! Kind-specific behaviour of built-in types that clients rely on: Services get
//! a ClusterIP, Namespaces and PVCs a phase, Pods their defaults, CRDs the
//! Established condition kubectl waits for.

use super::cluster::Cluster;
use super::error::ApiError;
use super::resources::{ResourceType, types_from_crd};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};

pub fn on_write(
    cluster: &Cluster,
    rt: &ResourceType,
    old: Option<&Value>,
    v: &mut Value,
) -> Result<(), ApiError> {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "services") => service(cluster, old, v),
        ("", "namespaces") => {
            if old.is_none() {
                v["status"] = json!({"phase": "Active"});
            }
            Ok(())
        }
        ("", "persistentvolumeclaims") => {
            if old.is_none() {
                v["status"] = json!({"phase": "Pending"});
                super::pvc_protection::admit(v);
            }
            Ok(())
        }
        ("", "pods") => {
            pod_defaults(v);
            if old.is_none() {
                v["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            Ok(())
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => crd(rt, v),
        // Stored in the core shape with kube's zero values (see `events`).
        ("", "events") => {
            *v = super::events::core_view(v);
            Ok(())
        }
        // The API server's defaults for a class.
        ("storage.k8s.io", "storageclasses") => {
            for (k, d) in [
                ("reclaimPolicy", "Delete"),
                ("volumeBindingMode", "Immediate"),
            ] {
                if v.get(k).is_none_or(Value::is_null) {
                    v[k] = json!(d);
                }
            }
            Ok(())
        }
        ("", "secrets") => {
            secret_string_data(v);
            secret_type_immutable(old, v)?;
            service_account_token(cluster, old, v);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// NodePort and LoadBalancer Services get a node port per port from kube's
/// range (30000–32767, unique in the cluster), kept across updates; a port
/// the client asks for is checked with kube-apiserver's messages. Other
/// types drop them (as kube does when the type changes) and release them.
/// (The process runtime allocates but does not listen on node ports: the
/// ingress IP is how another cluster reaches a LoadBalancer Service.)
fn node_ports(cluster: &Cluster, old: Option<&Value>, v: &mut Value) -> Result<(), ApiError> {
    let port_list = |o: &Value| -> Vec<(u64, u16)> {
        o.ptr("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let n = u16::try_from(p.get("nodePort")?.as_u64()?).ok()?;
                Some((p.get("port").and_then(Value::as_u64).unwrap_or(0), n))
            })
            .collect()
    };
    let held = old.map(port_list).unwrap_or_default();
    let name = v
        .ptr("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let wants = matches!(
        v.ptr("/spec/type").and_then(Value::as_str),
        Some("NodePort" | "LoadBalancer")
    );
    let mut kept = vec![];
    let mut causes = vec![];
    let ports = v.pointer_mut("/spec/ports").and_then(Value::as_array_mut);
    for (i, p) in ports.into_iter().flatten().enumerate() {
        let Some(m) = p.as_object_mut() else { continue };
        if !wants {
            m.remove("nodePort");
            continue;
        }
        let field = format!("spec.ports[{i}].nodePort");
        let port = m.get("port").and_then(Value::as_u64).unwrap_or(0);
        let asked = m.get("nodePort").and_then(Value::as_u64);
        let got = match asked {
            Some(n) if !crate::ipam::NODE_PORTS.contains(&u16::try_from(n).unwrap_or(0)) => {
                Err(format!(
                    "{field}: Invalid value: {n}: provided port is not in the valid range. The range of valid ports is 30000-32767"
                ))
            }
            Some(n) => {
                let n = u16::try_from(n).unwrap_or(0);
                if held.iter().any(|(_, h)| *h == n) || cluster.ipam.reserve_node_port(n) {
                    Ok(n)
                } else {
                    Err(format!(
                        "{field}: Invalid value: {n}: provided port is already allocated"
                    ))
                }
            }
            None => held
                .iter()
                .find(|(p, h)| *p == port && !kept.contains(h))
                .map(|(_, h)| *h)
                .or_else(|| cluster.ipam.node_port())
                .ok_or_else(|| format!("{field}: Internal error: range is full")),
        };
        match got {
            Ok(n) => {
                m.insert("nodePort".into(), json!(n));
                kept.push(n);
            }
            Err(msg) => causes.push((field, "FieldValueInvalid".to_string(), msg)),
        }
    }
    if !causes.is_empty() {
        for n in kept.iter().filter(|n| !held.iter().any(|(_, h)| h == *n)) {
            cluster.ipam.release_node_port(*n);
        }
        return Err(ApiError::invalid("Service", &name, causes));
    }
    for (_, h) in held.iter().filter(|(_, h)| !kept.contains(h)) {
        cluster.ipam.release_node_port(*h);
    }
    Ok(())
}

fn service(cluster: &Cluster, old: Option<&Value>, v: &mut Value) -> Result<(), ApiError> {
    let spec = v.get_mut("spec").filter(|s| s.is_object()).ok_or_else(|| {
        ApiError::invalid(
            "Service",
            "",
            vec![(
                "spec".into(),
                "FieldValueRequired".into(),
                "spec: Required value".into(),
            )],
        )
    })?;
    if spec.get("type").is_none() {
        spec["type"] = json!("ClusterIP");
    }
    if spec.get("sessionAffinity").is_none() {
        spec["sessionAffinity"] = json!("None");
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none()
                && let Some(port) = p.get("port").cloned()
            {
                p["targetPort"] = port;
            }
        }
    }
    node_ports(cluster, old, v)?;
    let Some(spec) = v.get_mut("spec") else {
        return Ok(());
    };
    let old_ip = old
        .and_then(|o| o.ptr("/spec/clusterIP"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let is_external = spec.get("type").and_then(Value::as_str) == Some("ExternalName");
    let ip = match (old_ip, spec.get("clusterIP").and_then(Value::as_str)) {
        (Some(old), _) => old.to_string(),
        (None, Some(ip)) if !ip.is_empty() => {
            cluster.ipam.reserve(ip);
            ip.to_string()
        }
        _ if is_external => return Ok(()),
        _ => cluster.ipam.service_ip(),
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if v.get("status").is_none() {
        v["status"] = json!({"loadBalancer": {}});
    }
    Ok(())
}

/// The type defaults to Opaque; `stringData` is write-only: merged into
/// `data` (base64), as kube does.
fn secret_string_data(v: &mut Value) {
    use base64::Engine;
    // kube defaults the type of every Secret, with or without stringData.
    if v.get("type").is_none_or(|t| t.as_str() == Some("")) {
        v["type"] = json!("Opaque");
    }
    let Some(sd) = v.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    if !v.get("data").is_some_and(Value::is_object) {
        v["data"] = json!({});
    }
    if let Some(m) = sd.as_object() {
        for (k, val) in m {
            let raw = val.as_str().unwrap_or_default();
            v["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(raw));
        }
    }
}

/// The token controller's part: a new `kubernetes.io/service-account-token`
/// Secret gets a token, the namespace and the cluster CA, so
/// `deploy/member/make-kubeconfig.sh` can turn it into a kubeconfig. (Done on
/// create rather than a moment later; clients wait for the field either way.)
///
/// Only the controller fills these keys: whatever the writer put there is
/// replaced. Tokens here are opaque strings looked up among these Secrets
/// (no signature a real cluster would verify), so a creator-chosen token
/// would let anyone who may create a Secret authenticate as a service
/// account with a token they picked. Any later write keeps the issued token:
/// it must not change under the kubeconfigs made from it.
fn service_account_token(cluster: &Cluster, old: Option<&Value>, v: &mut Value) {
    use base64::Engine;
    if v.get("type").and_then(Value::as_str) != Some(super::server::SA_TOKEN_TYPE) {
        return;
    }
    if !v.get("data").is_some_and(Value::is_object) {
        v["data"] = json!({});
    }
    let issued = old
        .filter(|o| o.get("type").and_then(Value::as_str) == Some(super::server::SA_TOKEN_TYPE))
        .and_then(|o| o.get("data"))
        .filter(|d| d.get("token").is_some());
    if let Some(data) = issued {
        for k in ["token", "namespace", "ca.crt"] {
            match data.get(k) {
                Some(x) => v["data"][k] = x.clone(),
                None => {
                    if let Some(m) = v["data"].as_object_mut() {
                        m.remove(k);
                    }
                }
            }
        }
        return;
    }
    let b64 = |s: &str| json!(base64::engine::general_purpose::STANDARD.encode(s));
    let token = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    let ns = v
        .ptr("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    v["data"]["token"] = b64(&token);
    v["data"]["namespace"] = b64(&ns);
    match cluster.ca_pem.get() {
        Some(ca) => v["data"]["ca.crt"] = b64(ca),
        None => {
            if let Some(m) = v["data"].as_object_mut() {
                m.remove("ca.crt");
            }
        }
    }
}

/// A Secret's type cannot change (kube: "field is immutable"); otherwise an
/// Opaque Secret holding a chosen `token` could become a token Secret.
fn secret_type_immutable(old: Option<&Value>, v: &Value) -> Result<(), ApiError> {
    let Some(o) = old else { return Ok(()) };
    let (before, after) = (
        o.get("type").and_then(Value::as_str).unwrap_or("Opaque"),
        v.get("type").and_then(Value::as_str).unwrap_or("Opaque"),
    );
    if before == after {
        return Ok(());
    }
    let name = v
        .ptr("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid(
        "Secret",
        name,
        vec![(
            "type".into(),
            "FieldValueInvalid".into(),
            format!("type: Invalid value: {after:?}: field is immutable"),
        )],
    ))
}

fn pod_defaults(v: &mut Value) {
    let Some(spec) = v.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    for (k, d) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
    ] {
        if spec.get(k).is_none() {
            spec[k] = d;
        }
    }
    if let Some(cs) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in cs {
            if c.get("imagePullPolicy").is_none() {
                c["imagePullPolicy"] = json!("IfNotPresent");
            }
            if c.get("terminationMessagePath").is_none() {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
        }
    }
}

fn crd(rt: &ResourceType, v: &mut Value) -> Result<(), ApiError> {
    let name = v
        .ptr("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let s = |p: &str| {
        v.ptr(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (group, plural, kind) = (
        s("/spec/group"),
        s("/spec/names/plural"),
        s("/spec/names/kind"),
    );
    let mut causes = vec![];
    let mut req = |field: &str, ok: bool| {
        if !ok {
            causes.push((
                field.to_string(),
                "FieldValueRequired".to_string(),
                format!("{field}: Required value"),
            ));
        }
    };
    req("spec.group", !group.is_empty());
    req("spec.names.plural", !plural.is_empty());
    req("spec.names.kind", !kind.is_empty());
    let versions = v
        .ptr("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    req("spec.versions", versions > 0);
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push((
            "metadata.name".into(),
            "FieldValueInvalid".into(),
            format!("metadata.name: Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(&rt.kind, &name, causes));
    }
    let stored: Vec<Value> = types_from_crd(v).iter().map(|t| json!(t.version)).collect();
    let now = super::cluster::now_rfc3339();
    let names = v.ptr("/spec/names").cloned().unwrap_or(json!({}));
    v["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ]
    });
    Ok(())
}
