//! Watches on the embedded API server through `kube::Client`: raw watch
//! events, resuming from a resourceVersion, `410 Gone`, bookmarks, selector
//! transitions, and kube-runtime's `watcher` with streaming lists and with the
//! default list-then-watch, including reconnecting after dropped watches.
#![allow(clippy::unwrap_used)]

mod support;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use std::collections::BTreeSet;
use std::pin::Pin;
use support::*;

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

type Events = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Send>>;

async fn watch(api: &Api<ConfigMap>, wp: &WatchParams, rv: &str) -> Events {
    api.watch(wp, rv).await.unwrap().boxed()
}

/// The next event that is not a bookmark, as (type, name).
async fn next_change(s: &mut Events) -> (String, String) {
    loop {
        let ev = tokio::time::timeout(PATIENCE, s.next())
            .await
            .expect("a watch event within the patience window")
            .expect("the watch stream to stay open")
            .expect("a watch event, not a transport error");
        return match ev {
            WatchEvent::Added(o) => ("ADDED".into(), o.name_any()),
            WatchEvent::Modified(o) => ("MODIFIED".into(), o.name_any()),
            WatchEvent::Deleted(o) => ("DELETED".into(), o.name_any()),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        };
    }
}

fn ev(t: &str, n: &str) -> (String, String) {
    (t.to_string(), n.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_changes_resumes_and_expires() {
    let s = start("watch").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let rv0 = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = watch(&api, &WatchParams::default(), &rv0).await;

    let created = api
        .create(&Default::default(), &cm("a", json!({})))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    assert_eq!(next_change(&mut w).await, ev("ADDED", "a"));
    assert_eq!(next_change(&mut w).await, ev("MODIFIED", "a"));
    assert_eq!(next_change(&mut w).await, ev("DELETED", "a"));

    // Resuming from the ADDED revision replays what came after it.
    let mut resumed = watch(
        &api,
        &WatchParams::default(),
        &created.resource_version().unwrap(),
    )
    .await;
    assert_eq!(next_change(&mut resumed).await, ev("MODIFIED", "a"));
    assert_eq!(next_change(&mut resumed).await, ev("DELETED", "a"));

    // A watch without a revision starts with the current objects.
    api.create(&Default::default(), &cm("b", json!({})))
        .await
        .unwrap();
    let mut fresh = watch(&api, &WatchParams::default(), "0").await;
    assert_eq!(next_change(&mut fresh).await, ev("ADDED", "b"));

    // Once history is compacted, an old revision is 410 Gone.
    s.cluster().cluster.store.compact();
    let mut old = watch(&api, &WatchParams::default(), &rv0).await;
    let first = tokio::time::timeout(PATIENCE, old.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match first {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}"),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_carry_the_current_revision() {
    let s = start("bookmarks").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let made = api
        .create(&Default::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let rv = made.resource_version().unwrap();
    let mut w = watch(&api, &WatchParams::default(), &rv).await;
    let bm = loop {
        let e = tokio::time::timeout(PATIENCE, w.next())
            .await
            .expect("a bookmark")
            .unwrap()
            .unwrap();
        if let WatchEvent::Bookmark(b) = e {
            break b;
        }
    };
    let brv: u64 = bm.metadata.resource_version.parse().unwrap();
    assert!(brv >= rv.parse::<u64>().unwrap());
    assert_eq!(bm.types.kind, "ConfigMap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_watches_see_objects_enter_and_leave() {
    let s = start("watch-selector").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = watch(&api, &WatchParams::default().labels("app=db"), &rv).await;
    api.create(&Default::default(), &cm("other", json!({"app": "web"})))
        .await
        .unwrap();
    api.create(&Default::default(), &cm("x", json!({})))
        .await
        .unwrap();
    let pp = PatchParams::default();
    api.patch(
        "x",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();
    api.patch("x", &pp, &Patch::Merge(json!({"data": {"k": "2"}})))
        .await
        .unwrap();
    api.patch(
        "x",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    api.create(&Default::default(), &cm("y", json!({"app": "db"})))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut w).await,
        ev("ADDED", "x"),
        "entering the selection"
    );
    assert_eq!(next_change(&mut w).await, ev("MODIFIED", "x"));
    assert_eq!(
        next_change(&mut w).await,
        ev("DELETED", "x"),
        "leaving the selection"
    );
    assert_eq!(
        next_change(&mut w).await,
        ev("ADDED", "y"),
        "objects outside were never sent"
    );

    let mut by_name = watch(&api, &WatchParams::default().fields("metadata.name=y"), &rv).await;
    assert_eq!(next_change(&mut by_name).await, ev("ADDED", "y"));
}

/// Names the watcher knows at the moment, from its events (a tiny reflector).
#[derive(Default)]
struct Seen {
    live: BTreeSet<String>,
    buffer: BTreeSet<String>,
    init_done: usize,
}

impl Seen {
    fn apply(&mut self, e: watcher::Event<ConfigMap>) {
        match e {
            watcher::Event::Init => self.buffer.clear(),
            watcher::Event::InitApply(o) => {
                self.buffer.insert(o.name_any());
            }
            watcher::Event::InitDone => {
                self.live = std::mem::take(&mut self.buffer);
                self.init_done += 1;
            }
            watcher::Event::Apply(o) => {
                self.live.insert(o.name_any());
            }
            watcher::Event::Delete(o) => {
                self.live.remove(&o.name_any());
            }
        }
    }
}

type WatcherStream =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Send>>;

/// Feeds events into `seen` until `done` holds.
async fn until(w: &mut WatcherStream, seen: &mut Seen, what: &str, done: impl Fn(&Seen) -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done(seen) {
            match w.try_next().await {
                Ok(Some(e)) => seen.apply(e),
                Ok(None) => panic!("the watcher ended"),
                // Errors are retried by the backoff; keep going.
                Err(_) => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; the watcher knows {:?}",
            seen.live
        )
    });
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn exercise_watcher(tag: &str, config: watcher::Config) {
    let s = start(tag).await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    for n in ["a", "b", "c"] {
        api.create(&Default::default(), &cm(n, json!({"w": "1"})))
            .await
            .unwrap();
    }
    let mut w: WatcherStream = watcher(api.clone(), config.labels("w=1"))
        .default_backoff()
        .boxed();
    let mut seen = Seen::default();
    until(&mut w, &mut seen, "the initial list", |s| s.init_done == 1).await;
    assert_eq!(seen.live, names(&["a", "b", "c"]));

    api.create(&Default::default(), &cm("d", json!({"w": "1"})))
        .await
        .unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    until(&mut w, &mut seen, "d added and a deleted", |s| {
        s.live == names(&["b", "c", "d"])
    })
    .await;

    // Dropped watches: the watcher reconnects and still sees later changes.
    s.cluster().cluster.faults.drop_watches();
    api.create(&Default::default(), &cm("e", json!({"w": "1"})))
        .await
        .unwrap();
    until(&mut w, &mut seen, "e after dropped watches", |s| {
        s.live.contains("e")
    })
    .await;

    // Dropped watches plus compacted history: the resume gets 410 Gone and
    // the watcher lists again, missing nothing.
    s.cluster().cluster.faults.drop_watches();
    s.cluster().cluster.store.compact();
    api.delete("b", &Default::default()).await.unwrap();
    api.create(&Default::default(), &cm("f", json!({"w": "1"})))
        .await
        .unwrap();
    until(&mut w, &mut seen, "the state after a relist", |s| {
        s.live == names(&["c", "d", "e", "f"])
    })
    .await;

    // The admin endpoint drops watches too.
    let (code, _) = admin_request(
        s.sim.admin_addr.unwrap(),
        "POST",
        "/clusters/a/drop-watches",
        &s.cluster().token,
        None,
    )
    .await;
    assert_eq!(code, 204);
    api.create(&Default::default(), &cm("g", json!({"w": "1"})))
        .await
        .unwrap();
    until(
        &mut w,
        &mut seen,
        "g after the admin dropped watches",
        |s| s.live.contains("g"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_with_streaming_lists() {
    exercise_watcher(
        "watcher-streaming",
        watcher::Config::default().streaming_lists(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_with_list_then_watch() {
    exercise_watcher("watcher-listwatch", watcher::Config::default().page_size(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_ends_with_an_initial_events_bookmark() {
    let s = start("streaming").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    api.create(&Default::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let wp = WatchParams {
        send_initial_events: true,
        ..WatchParams::default()
    };
    let mut w = watch(&api, &wp, "").await;
    let mut added = vec![];
    let bm = loop {
        match tokio::time::timeout(PATIENCE, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(o) => added.push(o.name_any()),
            WatchEvent::Bookmark(b) => break b,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(added, vec!["a"]);
    assert_eq!(
        bm.metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_end_open_streams() {
    let s = start("drop").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = watch(&api, &WatchParams::default(), &rv).await;
    // Make sure the stream is live before dropping it.
    api.create(&Default::default(), &cm("a", json!({})))
        .await
        .unwrap();
    assert_eq!(next_change(&mut w).await, ev("ADDED", "a"));
    s.cluster().cluster.faults.drop_watches();
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match w.next().await {
                None => return,
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                Some(other) => panic!("unexpected {other:?} after dropping watches"),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the stream ended");
    // New watches still work.
    let mut again = watch(&api, &WatchParams::default(), &rv).await;
    assert_eq!(next_change(&mut again).await, ev("ADDED", "a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_only_lists_gets_and_watches() {
    use kube::core::PartialObjectMeta;
    let s = start("metadata").await;
    let client = s.client().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&Default::default(), &cm("a", json!({"w": "1"})))
        .await
        .unwrap();
    let meta: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(client.clone());

    let list = meta.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let types = list.items[0].types.clone().unwrap();
    assert_eq!(
        (types.kind.as_str(), types.api_version.as_str()),
        ("PartialObjectMetadata", "meta.k8s.io/v1")
    );
    let one = api.get_metadata("a").await.unwrap();
    assert_eq!(one.types.unwrap().kind, "PartialObjectMetadata");
    assert_eq!(one.metadata.labels.unwrap()["w"], "1");
    // The raw answer carries no data, only metadata.
    let req = axum::http::Request::get("/api/v1/namespaces/default/configmaps")
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .body(vec![])
        .unwrap();
    let raw: serde_json::Value = client.request(req).await.unwrap();
    assert_eq!(raw["kind"], "PartialObjectMetadataList");
    assert!(raw["items"][0].get("data").is_none(), "{raw}");

    // A metadata watcher sees changes as PartialObjectMetadata.
    let mut w = watcher(meta, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut names = BTreeSet::new();
    api.create(&Default::default(), &cm("b", json!({})))
        .await
        .unwrap();
    tokio::time::timeout(PATIENCE, async {
        while !names.contains("b") {
            match w.try_next().await.unwrap().unwrap() {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    assert_eq!(o.types.as_ref().unwrap().kind, "PartialObjectMetadata");
                    names.insert(o.metadata.name.unwrap());
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the metadata watcher to see b");
}
