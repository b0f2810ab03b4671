//! Host veth teardown through real netlink, inside a network namespace this test creates (an
//! anonymous one, unshared by the test thread; it disappears with the thread).

mod common;

use std::{sync::Arc, time::Duration};

use aliasnet_ipam::teardown::{link_exists, NetlinkRemover};
use aliasnet_ipam_proto::{Attachment, Request, Response};
use common::*;
use nix::sched::CloneFlags;
use rtnetlink::LinkVeth;

async fn add_veth(handle: &rtnetlink::Handle, name: &str) {
    handle
        .link()
        .add(LinkVeth::new(name, &format!("{name}p")).build())
        .execute()
        .await
        .unwrap_or_else(|e| panic!("creating veth {name}: {e}"));
    assert!(link_exists(handle, name).await.unwrap());
}

async fn scenario() {
    let remover = Arc::new(NetlinkRemover::new().expect("netlink socket"));
    let handle = remover.handle().clone();
    add_veth(&handle, "alitdown0").await;

    // One address, no cooldown: only the teardown stands between release and reuse.
    let env = Env::new("cooldown = \"0s\"", "ips = [\"10.240.0.7\"]");
    let d = env.start(remover.clone()).await;
    let socket = env.socket();

    let r = call(&socket, alloc_req("old", Some("alitdown0")))
        .await
        .unwrap();
    assert!(matches!(r, Response::Allocated { .. }), "{r:?}");
    let r = call(
        &socket,
        Request::Release {
            key: key("old"),
            teardown_link: Some("alitdown0".into()),
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );
    // The address is handed out again only once the old veth is really gone.
    let new = allocate(&socket, "new").await;
    assert_eq!(new.address.to_string(), "10.240.0.7");
    assert!(
        !link_exists(&handle, "alitdown0").await.unwrap(),
        "address reused while its old veth still existed"
    );
    assert!(
        !link_exists(&handle, "alitdown0p").await.unwrap(),
        "peer gone too"
    );

    // A link that does not exist is fine.
    let r = call(
        &socket,
        Request::Release {
            key: key("new"),
            teardown_link: Some("alinothere".into()),
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(r, Response::Released { address: Some(_) }),
        "{r:?}"
    );

    // GC tears down the host veth of what it releases.
    add_veth(&handle, "aligc0").await;
    let r = call(&socket, alloc_req("gc1", Some("aligc0")))
        .await
        .unwrap();
    assert!(matches!(r, Response::Allocated { .. }), "{r:?}");
    let r = call(
        &socket,
        Request::Gc {
            network: "net".into(),
            valid: Vec::<Attachment>::new(),
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(r, Response::GcDone { ref released } if released.len() == 1),
        "{r:?}"
    );
    allocate(&socket, "after").await;
    assert!(!link_exists(&handle, "aligc0").await.unwrap());

    d.shutdown().await;
}

#[test]
fn release_and_gc_delete_host_veths_before_reuse() {
    std::thread::spawn(|| {
        // This thread (and the runtime it drives) lives in its own netns from here on.
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare netns (needs root)");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), scenario())
                .await
                .expect("scenario finished in time");
        });
    })
    .join()
    .expect("scenario passed");
}
