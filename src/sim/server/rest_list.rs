//! Lists (`GET` of a collection): label and field selectors, pages with
//! `limit` and `continue` tokens against a snapshot's resourceVersion,
//! Tables and metadata-only answers. A child module of `rest.rs`, split so
//! that each reads in one sitting; watches share [`Filter`].

use super::*;

/// The objects a list or watch selects.
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    /// The selectors of a list or watch of `rt` (field labels of Events
    /// are checked and translated as kube does).
    pub fn from_query(rt: &ResourceType, q: &Query) -> Result<Self, ApiError> {
        let fields =
            events_view::core_filter_selector(rt, q.get("fieldSelector").unwrap_or_default())?;
        Ok(Filter {
            labels: LabelSelector::parse(q.get("labelSelector").unwrap_or_default())
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
            fields: FieldSelector::parse(&fields)
                .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?,
        })
    }

    /// Whether a stored object is selected: labels from its index, the
    /// object parsed only when a field selector needs it.
    pub fn matches_object(&self, o: &StoredObject) -> bool {
        self.labels.matches_object(o) && (self.fields.is_empty() || self.fields.matches(&o.value()))
    }
}

pub(super) fn list(
    ctx: &Ctx,
    rt: &ResourceType,
    ns: &str,
    q: &Query,
    headers: &axum::http::HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter::from_query(rt, q)?;
    let (after, snapshot_rv) = match q.get("continue") {
        Some(tok) => {
            let (ns, name, rv) = decode_continue(tok, ctx.cluster.store.compacted_rv())?;
            (Some((ns, name)), Some(rv))
        }
        None => (None, None),
    };
    let ns_opt = (!ns.is_empty()).then_some(ns);
    let (items, rv) = match filter.fields.pinned_name() {
        // One lookup instead of a scan, when the namespace is known too
        // (a namespaced kind listed across namespaces needs the scan). The
        // revision is read first: a write in between is then replayed to a
        // watch started from it, never lost.
        Some(name) if after.is_none() && (ns_opt.is_some() || !rt.namespaced) => {
            let rv = ctx.cluster.store.current_rv();
            let one = ctx.cluster.store.get(&rt.key(), ns, name);
            (one.into_iter().collect(), rv)
        }
        _ => ctx.cluster.store.list(&rt.key(), ns_opt, after.as_ref()),
    };
    // Every page of a paginated list reports the first page's revision, as
    // kube does: a watch started from the last page then replays whatever
    // changed while the pages were read (kube serves later pages from a
    // snapshot; this store serves the current state after the token's key,
    // so a change may arrive twice but is never lost).
    let rv = snapshot_rv.unwrap_or(rv);
    let limit = q.int("limit").filter(|l| *l > 0).map(|l| l as usize);
    let mut selected = vec![];
    let mut cont = None;
    for o in items {
        if !filter.matches_object(&o) {
            continue;
        }
        if limit.is_some_and(|l| selected.len() >= l) {
            let last: &Arc<StoredObject> = &selected[selected.len() - 1];
            cont = Some(encode_continue(rv, last));
            break;
        }
        selected.push(o);
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = &cont {
        meta["continue"] = json!(c);
    }
    if wants_table(headers) {
        let objs: Vec<Value> = selected.iter().map(|o| o.value()).collect();
        let t = table::build_table(
            &columns(rt),
            &objs,
            q.get("includeObject").unwrap_or("Metadata"),
            meta,
            chrono::Utc::now(),
        );
        return Ok(json_response(StatusCode::OK, &t));
    }
    if wants_metadata(headers) {
        let items: Vec<Value> = selected.iter().map(|o| metadata_only_of(o)).collect();
        let l = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
        return Ok(json_response(StatusCode::OK, &l));
    }
    let mut buf =
        BytesMut::with_capacity(128 + selected.iter().map(|o| o.json.len() + 1).sum::<usize>());
    buf.put_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
            rt.kind,
            rt.api_version(),
            meta
        )
        .as_bytes(),
    );
    for (i, o) in selected.iter().enumerate() {
        if i > 0 {
            buf.put_u8(b',');
        }
        buf.put_slice(&o.json);
    }
    buf.put_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, buf.freeze()))
}

fn encode_continue(rv: u64, last: &StoredObject) -> String {
    let tok = json!({"rv": rv, "ns": last.namespace(), "name": last.name()});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tok.to_string())
}

/// Continue tokens name the last key returned and the first page's revision.
/// Kube serves the rest from a snapshot at that revision; this store serves
/// the current state after that key (documented), and answers 410 once the
/// revision has left the watch history (a watch from it could not resume).
fn decode_continue(tok: &str, compacted: u64) -> Result<(String, String, u64), ApiError> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(tok)
        .map_err(|_| ApiError::bad_request("invalid continue token"))?;
    let v: Value = serde_json::from_slice(&raw)
        .map_err(|_| ApiError::bad_request("invalid continue token"))?;
    let rv = v
        .get("rv")
        .and_then(Value::as_u64)
        .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
    if rv < compacted {
        return Err(ApiError::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
        ));
    }
    Ok((
        str_at(&v, "/ns").to_string(),
        str_at(&v, "/name").to_string(),
        rv,
    ))
}
