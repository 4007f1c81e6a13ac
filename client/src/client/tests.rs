//! Routing against fake nodes on loopback: catalog changes following
//! `NOT_OWNER` to a cluster's controller leader (`control`), a data call
//! whose owner went away dropping the cached metadata so the next call
//! finds the new owner, the Claim version a claim goes out as (with or
//! without a subscription), and the DescribeQueue version a describe asks.

#![allow(clippy::unwrap_used)] // test support: a failure here is a test failure

use std::sync::{Arc, Mutex};
use std::time::Duration;

use spool_wire::proto::{
    ApiKey, AssignmentVersion, ClaimResponse, CorrelationId, CreateQueueResponse,
    DeleteQueueRequest, DeleteQueueResponse, DescribeQueueRequest, DescribeQueueResponse,
    ErrorResponse, FrameDecoder, KeyMapStats, LeaderEpoch, MetadataResponse, NodeAddress,
    PartitionId, PartitionMetadata, PartitionStats, ProtoError, PurgeResponse, QueueConfig,
    QueueMetadata, Request, Response, RetainedStats, SubscriptionStart, SubscriptionStats,
};
use spool_wire::ErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::ClientError;
use crate::limits::{LEADER_WAIT_ATTEMPTS_MAX, ROUTE_ATTEMPTS_MAX};
use crate::{default_queue_config, Admin, ClaimOptions, Client};

type Handler = dyn Fn(&Request<'_>, CorrelationId) -> Vec<u8> + Send + Sync;

/// A handler that also sees the request's api version.
type VersionedHandler = dyn Fn(&Request<'_>, CorrelationId, u16) -> Vec<u8> + Send + Sync;

/// Serves every connection on a fresh loopback port with `handler`;
/// returns the port.
async fn serve(handler: Arc<Handler>) -> u16 {
    serve_versioned(Arc::new(move |request: &Request<'_>, id, _| handler(request, id))).await
}

/// [`serve`] with a handler that sees each request's version.
async fn serve_versioned(handler: Arc<VersionedHandler>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                let mut decoder = FrameDecoder::new();
                loop {
                    while let Some(frame) = decoder.next_frame().unwrap() {
                        let request = Request::decode(&frame).unwrap();
                        let version = frame.header.api_version;
                        let out = handler(&request, frame.header.correlation_id, version);
                        socket.write_all(&out).await.unwrap();
                    }
                    match socket.read(decoder.read_buf().unwrap()).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => decoder.advance(read),
                    }
                }
            });
        }
    });
    port
}

fn encode(id: CorrelationId, response: Response<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    response.encode(id, &mut out).unwrap();
    out
}

fn not_owner(id: CorrelationId, key: ApiKey, hint: Option<u16>) -> Vec<u8> {
    let owner = hint.map(|port| NodeAddress { host: "127.0.0.1".into(), port });
    let message = "not the controller leader".to_owned();
    let mut out = Vec::new();
    ErrorResponse { code: ErrorCode::NotOwner, message, owner }
        .encode(id, key.as_u16(), 0, &mut out)
        .unwrap();
    out
}

const VERSION: AssignmentVersion = AssignmentVersion(7);

/// What a fake node answers a catalog change: served (`None`) or
/// `NOT_OWNER` with this owner hint (`Some(None)`: no hint).
type Answer = Option<Option<u16>>;

/// A fake node that answers Metadata with nothing and each catalog change
/// as `answer` says given how many it has seen (counted in `seen`).
struct Fake {
    addr: String,
    port: u16,
    seen: Arc<Mutex<u32>>,
}

async fn catalog_node(answer: impl Fn(u32) -> Answer + Send + Sync + 'static) -> Fake {
    let seen = Arc::new(Mutex::new(0u32));
    let counter = Arc::clone(&seen);
    let handler = move |request: &Request<'_>, id| {
        let key = match request {
            Request::Metadata(_) => {
                let response = MetadataResponse { assignment_version: VERSION, queues: Vec::new() };
                return encode(id, Response::Metadata(response));
            }
            Request::CreateQueue(_) => ApiKey::CreateQueue,
            Request::DeleteQueue(_) => ApiKey::DeleteQueue,
            other => panic!("unexpected {other:?}"),
        };
        let count = {
            let mut seen = counter.lock().unwrap();
            *seen += 1;
            *seen
        };
        match answer(count) {
            None if key == ApiKey::CreateQueue => encode(
                id,
                Response::CreateQueue(CreateQueueResponse { assignment_version: VERSION }),
            ),
            None => encode(
                id,
                Response::DeleteQueue(DeleteQueueResponse { assignment_version: VERSION }),
            ),
            Some(hint) => not_owner(id, key, hint),
        }
    };
    let port = serve(Arc::new(handler)).await;
    Fake { addr: format!("127.0.0.1:{port}"), port, seen }
}

fn seen(fake: &Fake) -> u32 {
    *fake.seen.lock().unwrap()
}

async fn bounded<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), future).await.expect("within 15 s")
}

// Goal: a create sent to a follower reaches the controller leader it
// names. Method: the bootstrap refuses naming the leader; the leader
// serves; each must see exactly one create.
#[tokio::test]
async fn create_follows_the_named_leader() {
    let leader = catalog_node(|_| None).await;
    let port = leader.port;
    let follower = catalog_node(move |_| Some(Some(port))).await;
    let admin = Admin::new(Client::connect(&follower.addr).await.unwrap());
    let version = bounded(admin.create_queue("jobs", default_queue_config(2))).await.unwrap();
    assert_eq!(version, VERSION);
    assert_eq!((seen(&follower), seen(&leader)), (1, 1));
}

// Goal: while no leader is known the call waits and asks again, and a
// delete is routed like a create. Method: the bootstrap answers NOT_OWNER
// without an owner twice, then serves.
#[tokio::test]
async fn delete_waits_for_a_leader() {
    let node = catalog_node(|count| (count <= 2).then_some(None)).await;
    let admin = Admin::new(Client::connect(&node.addr).await.unwrap());
    bounded(admin.delete_queue("jobs")).await.unwrap();
    assert_eq!(seen(&node), 3);
}

// Goal: a named leader that cannot be reached (it just died) sends the
// call back to the bootstrap, which names the new leader once it knows.
// Method: the bootstrap first names a closed port, then a live leader.
#[tokio::test]
async fn an_unreachable_leader_sends_the_call_back_to_the_bootstrap() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let leader = catalog_node(|_| None).await;
    let port = leader.port;
    let follower =
        catalog_node(move |count| Some(Some(if count == 1 { closed } else { port }))).await;
    let admin = Admin::new(Client::connect(&follower.addr).await.unwrap());
    bounded(admin.create_queue("jobs", default_queue_config(1))).await.unwrap();
    assert_eq!((seen(&follower), seen(&leader)), (2, 1));
}

// Goal: hops are bounded. Method: two nodes name each other forever; the
// call ends with ControlRouteExhausted after ROUTE_ATTEMPTS_MAX.
#[tokio::test]
async fn named_owners_are_followed_a_bounded_number_of_times() {
    let ports = Arc::new(Mutex::new((0u16, 0u16)));
    let (first_ports, second_ports) = (Arc::clone(&ports), Arc::clone(&ports));
    let first = catalog_node(move |_| Some(Some(first_ports.lock().unwrap().1))).await;
    let second = catalog_node(move |_| Some(Some(second_ports.lock().unwrap().0))).await;
    *ports.lock().unwrap() = (first.port, second.port);
    let admin = Admin::new(Client::connect(&first.addr).await.unwrap());
    let error = bounded(admin.create_queue("jobs", default_queue_config(1))).await.unwrap_err();
    assert!(
        matches!(error, ClientError::ControlRouteExhausted { attempts, .. } if attempts == ROUTE_ATTEMPTS_MAX),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(ErrorCode::NotOwner));
    assert!(!error.is_retriable());
    assert_eq!(seen(&first) + seen(&second), ROUTE_ATTEMPTS_MAX);
}

// Goal: waiting for a leader is bounded too. Method: the node never names
// one; the first wait is 1 ms so the test takes well under 1 s.
#[tokio::test]
async fn waiting_for_a_leader_is_bounded() {
    let node = catalog_node(|_| Some(None)).await;
    let client = Client::connect(&node.addr).await.unwrap();
    let request = Request::DeleteQueue(DeleteQueueRequest { name: "jobs".into() });
    let pacing = client.catalog_call_pacing("delete queue", &request, Duration::from_millis(1));
    let error = bounded(pacing).await.unwrap_err();
    assert!(matches!(error, ClientError::ControlRouteExhausted { .. }), "{error:?}");
    assert_eq!(seen(&node), LEADER_WAIT_ATTEMPTS_MAX);
}

// Goal: a single node is asked once per call, as before.
#[tokio::test]
async fn a_single_node_is_asked_once() {
    let node = catalog_node(|_| None).await;
    let admin = Admin::new(Client::connect(&node.addr).await.unwrap());
    bounded(admin.create_queue("jobs", default_queue_config(1))).await.unwrap();
    assert_eq!(seen(&node), 1);
    bounded(admin.delete_queue("jobs")).await.unwrap();
    assert_eq!(seen(&node), 2);
}

// Goal: a data call that cannot reach the partition's owner (it died)
// drops the queue's cached metadata and goes to the owner fresh metadata
// names (nothing was sent, so any request may go again); while metadata
// keeps naming the dead owner the call fails with the I/O error, which is
// retriable. Method: the bootstrap's metadata names a closed port the
// first `dead` times, then itself; a purge with dead = 1 is served after
// one more metadata; with dead = 2 the first purge fails (its refresh
// still names the dead owner), the next is served.
#[tokio::test]
async fn an_unreachable_owner_drops_the_cached_metadata() {
    for dead in [1u32, 2] {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let metadata_asked = Arc::new(Mutex::new(0u32));
        let own_port = Arc::new(Mutex::new(0u16));
        let handler = {
            let (metadata_asked, own_port) = (Arc::clone(&metadata_asked), Arc::clone(&own_port));
            move |request: &Request<'_>, id| match request {
                Request::Metadata(_) => {
                    let mut asked = metadata_asked.lock().unwrap();
                    *asked += 1;
                    let port = if *asked <= dead { closed } else { *own_port.lock().unwrap() };
                    partition_metadata(id, port)
                }
                Request::Purge(_) => encode(id, Response::Purge(PurgeResponse { count: 3 })),
                other => panic!("unexpected {other:?}"),
            }
        };
        let port = serve(Arc::new(handler)).await;
        *own_port.lock().unwrap() = port;
        let admin = Admin::new(Client::connect(&format!("127.0.0.1:{port}")).await.unwrap());
        if dead > 1 {
            let error = bounded(admin.purge("jobs", PartitionId(0), true)).await.unwrap_err();
            assert!(matches!(error, ClientError::Io { .. }), "{error:?}");
            assert!(error.is_retriable());
        }
        assert_eq!(bounded(admin.purge("jobs", PartitionId(0), true)).await.unwrap(), 3);
        // The connect's fetch, then one after each failed connect: the
        // last of them names the live owner.
        let asked = *metadata_asked.lock().unwrap();
        assert_eq!(asked, dead + 1, "metadata fetches with {dead} dead answers");
    }
}

/// Metadata naming `port` for partition 0 of `jobs`.
fn partition_metadata(id: CorrelationId, port: u16) -> Vec<u8> {
    let partition = PartitionMetadata {
        partition: PartitionId(0),
        host: "127.0.0.1".into(),
        shard_port: port,
        leader_epoch: LeaderEpoch(1),
    };
    let queue = QueueMetadata { name: "jobs".into(), partitions: vec![partition], key_version: 1 };
    encode(
        id,
        Response::Metadata(MetadataResponse { assignment_version: VERSION, queues: vec![queue] }),
    )
}

// Goal: a data call whose partition has no leader yet (NOT_OWNER without
// an owner, metadata naming the node that refused) waits and asks again
// instead of spending its hops at once. Method: the only node refuses two
// purges that way, then serves; the call must succeed after 3 sends.
#[tokio::test]
async fn a_data_call_waits_for_an_election() {
    let purges = Arc::new(Mutex::new(0u32));
    let own_port = Arc::new(Mutex::new(0u16));
    let handler = {
        let (purges, own_port) = (Arc::clone(&purges), Arc::clone(&own_port));
        move |request: &Request<'_>, id| match request {
            Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
            Request::Purge(_) => {
                let mut purges = purges.lock().unwrap();
                *purges += 1;
                if *purges <= 2 {
                    not_owner(id, ApiKey::Purge, None)
                } else {
                    encode(id, Response::Purge(PurgeResponse { count: 5 }))
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let port = serve(Arc::new(handler)).await;
    *own_port.lock().unwrap() = port;
    let admin = Admin::new(Client::connect(&format!("127.0.0.1:{port}")).await.unwrap());
    assert_eq!(bounded(admin.purge("jobs", PartitionId(0), true)).await.unwrap(), 5);
    assert_eq!(*purges.lock().unwrap(), 3);
}

/// `NOT_LEADER` naming `leader_port`, as a broker of this version answers
/// a request of the version that may receive it.
fn not_leader(id: CorrelationId, key: ApiKey, leader_port: u16) -> Vec<u8> {
    let owner = Some(NodeAddress { host: "127.0.0.1".into(), port: leader_port });
    let message = "partition jobs/0 is led elsewhere".to_owned();
    let mut out = Vec::new();
    ErrorResponse { code: ErrorCode::NotLeader, message, owner }
        .encode(id, key.as_u16(), key.max_version(), &mut out)
        .unwrap();
    out
}

// Goal: NOT_LEADER is followed as NOT_OWNER is: a data call goes to the
// leader it names, and the typed error reads back. Method: a follower whose
// metadata names itself answers a purge NOT_LEADER naming a second node,
// which serves; each sees one purge.
#[tokio::test]
async fn a_data_call_follows_not_leader() {
    let leader_purges = Arc::new(Mutex::new(0u32));
    let leader = {
        let purges = Arc::clone(&leader_purges);
        serve(Arc::new(move |request: &Request<'_>, id| match request {
            Request::Purge(_) => {
                *purges.lock().unwrap() += 1;
                encode(id, Response::Purge(PurgeResponse { count: 5 }))
            }
            Request::Metadata(_) => encode(
                id,
                Response::Metadata(MetadataResponse {
                    assignment_version: VERSION,
                    queues: Vec::new(),
                }),
            ),
            other => panic!("unexpected {other:?}"),
        }))
        .await
    };
    let follower_purges = Arc::new(Mutex::new(0u32));
    let own_port = Arc::new(Mutex::new(0u16));
    let handler = {
        let (purges, own_port) = (Arc::clone(&follower_purges), Arc::clone(&own_port));
        move |request: &Request<'_>, id| match request {
            Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
            Request::Purge(_) => {
                *purges.lock().unwrap() += 1;
                not_leader(id, ApiKey::Purge, leader)
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let port = serve(Arc::new(handler)).await;
    *own_port.lock().unwrap() = port;
    let admin = Admin::new(Client::connect(&format!("127.0.0.1:{port}")).await.unwrap());
    assert_eq!(bounded(admin.purge("jobs", PartitionId(0), true)).await.unwrap(), 5);
    assert_eq!((*follower_purges.lock().unwrap(), *leader_purges.lock().unwrap()), (1, 1));

    let error = ClientError::from_response(
        ErrorCode::NotLeader,
        "led elsewhere".to_owned(),
        Some(NodeAddress { host: "127.0.0.1".into(), port: leader }),
    );
    assert!(matches!(error, ClientError::NotLeader { leader: Some(_), .. }), "{error:?}");
    assert_eq!(error.code(), Some(ErrorCode::NotLeader));
    assert!(error.is_retriable());
    assert!(error.to_string().starts_with("NOT_LEADER: led elsewhere"), "{error}");
}

// Goal: a claim names its subscription only when one is asked for, and
// only then is it sent as Claim v3 (an older broker serves the default
// subscription's claims as before); a subscription the queue does not have
// comes back as the broker's SUBSCRIPTION_NOT_FOUND, not retriable. Method:
// a node that records each Claim's version and subscription, answering an
// empty claim for "" and "audit" and SUBSCRIPTION_NOT_FOUND for any other
// name (as a broker answers a v3 claim); claims of one partition and of
// the shard with and without a subscription.
#[tokio::test]
async fn a_claim_names_its_subscription_in_version_3_only() {
    let seen: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let own_port = Arc::new(Mutex::new(0u16));
    let handler = {
        let (seen, own_port) = (Arc::clone(&seen), Arc::clone(&own_port));
        move |request: &Request<'_>, id, version: u16| match request {
            Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
            Request::Claim(claim) => {
                seen.lock().unwrap().push((version, claim.subscription.to_owned()));
                if matches!(claim.subscription, "" | "audit") {
                    let response = ClaimResponse { lease_deadline_ms: 1, deliveries: Vec::new() };
                    let mut out = Vec::new();
                    Response::Claim(response).encode_version(id, version, &mut out).unwrap();
                    return out;
                }
                let missing = ErrorResponse::new(ErrorCode::SubscriptionNotFound, "no sub");
                let mut out = Vec::new();
                missing.encode(id, ApiKey::Claim.as_u16(), version, &mut out).unwrap();
                out
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let port = serve_versioned(Arc::new(handler)).await;
    *own_port.lock().unwrap() = port;
    let client = Client::connect(&format!("127.0.0.1:{port}")).await.unwrap();
    let plain = ClaimOptions::new(1).wait_ms(0);
    let audit = plain.clone().subscription("audit");
    bounded(client.claim("jobs", PartitionId(0), &plain)).await.unwrap();
    bounded(client.claim("jobs", PartitionId(0), &audit)).await.unwrap();
    bounded(client.claim_shard("jobs", PartitionId(0), &audit)).await.unwrap();
    let error = bounded(client.claim("jobs", PartitionId(0), &plain.subscription("gone")))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClientError::Server { code: ErrorCode::SubscriptionNotFound, .. }),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(ErrorCode::SubscriptionNotFound));
    assert!(!error.is_retriable());
    assert_eq!(error.to_string(), "SUBSCRIPTION_NOT_FOUND: no sub");
    let seen = seen.lock().unwrap().clone();
    let expected = [(2, ""), (3, "audit"), (3, "audit"), (3, "gone")];
    let expected: Vec<(u16, String)> =
        expected.iter().map(|&(version, name)| (version, name.to_owned())).collect();
    assert_eq!(seen, expected);
}

// Goal: a subscription name outside the rule is refused before anything
// is sent. Method: a claim naming "no spaces" against a node that panics
// on any Claim.
#[tokio::test]
async fn a_bad_subscription_name_is_refused_before_sending() {
    let own_port = Arc::new(Mutex::new(0u16));
    let handler = {
        let own_port = Arc::clone(&own_port);
        move |request: &Request<'_>, id| match request {
            Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
            other => panic!("unexpected {other:?}"),
        }
    };
    let port = serve(Arc::new(handler)).await;
    *own_port.lock().unwrap() = port;
    let client = Client::connect(&format!("127.0.0.1:{port}")).await.unwrap();
    let options = ClaimOptions::new(1).wait_ms(0).subscription("no spaces");
    let error = bounded(client.claim("jobs", PartitionId(0), &options)).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Encode(ProtoError::InvalidSubscriptionName { .. })),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument));
}

/// A DescribeQueue answer for `jobs` (one partition) listing `subscriptions`.
fn describe_answer(subscriptions: Vec<SubscriptionStats>) -> DescribeQueueResponse {
    DescribeQueueResponse {
        name: "jobs".into(),
        config: default_queue_config(1),
        partitions: vec![PartitionStats {
            partition: PartitionId(0),
            ready: 4,
            scheduled: 0,
            claimed: 1,
            quarantined: 0,
            expired: 0,
            acked: 2,
            bytes: 10,
            oldest_ready_age_ms: 5,
            released: 0,
            lease_expired: 0,
            replication: None,
            retained: RetainedStats { messages: 6, bytes: 60, oldest_age_ms: 9 },
            lanes: spool_wire::proto::LaneStats::default(),
        }],
        keys: KeyMapStats { version: 1, draining: vec![], held_from: 1 },
        subscriptions,
    }
}

// Goal: `Admin::describe_queue` asks DescribeQueue v2 and lists what a new
// broker answers, and against a broker that predates v2 (it answers
// UNSUPPORTED_VERSION) asks v1 and lists no subscription, while a plain
// `Connection::call` of DescribeQueue goes as v1. Method: two fake nodes,
// one speaking up to v2 and one up to v1, recording the versions asked.
#[tokio::test]
async fn describe_asks_version_2_and_falls_back_to_version_1() {
    let listed = vec![SubscriptionStats {
        name: "default".into(),
        id: 0,
        start: SubscriptionStart::Earliest,
        partitions: 1,
        ready: 4,
        scheduled: 0,
        claimed: 1,
        dead_letters: 0,
        oldest_ready_age_ms: 5,
        oldest_claim_age_ms: 7,
        acked: 2,
        lost: 3,
    }];
    for newest in [2u16, 1] {
        let seen: Arc<Mutex<Vec<u16>>> = Arc::default();
        let own_port = Arc::new(Mutex::new(0u16));
        let handler = {
            let (seen, own_port, listed) =
                (Arc::clone(&seen), Arc::clone(&own_port), listed.clone());
            move |request: &Request<'_>, id, version: u16| match request {
                Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
                Request::DescribeQueue(_) => {
                    seen.lock().unwrap().push(version);
                    let mut out = Vec::new();
                    if version > newest {
                        ErrorResponse::new(ErrorCode::UnsupportedVersion, "v2 unknown")
                            .encode(id, ApiKey::DescribeQueue.as_u16(), version, &mut out)
                            .unwrap();
                    } else {
                        Response::DescribeQueue(describe_answer(listed.clone()))
                            .encode_version(id, version, &mut out)
                            .unwrap();
                    }
                    out
                }
                other => panic!("unexpected {other:?}"),
            }
        };
        let port = serve_versioned(Arc::new(handler)).await;
        *own_port.lock().unwrap() = port;
        let admin = Admin::new(Client::connect(&format!("127.0.0.1:{port}")).await.unwrap());
        let described = bounded(admin.describe_queue("jobs")).await.unwrap();
        assert_eq!(described.partitions.len(), 1);
        let expected = if newest == 2 { listed.clone() } else { Vec::new() };
        assert_eq!(described.subscriptions, expected, "broker speaking v{newest}");
        let asked = if newest == 2 { vec![2] } else { vec![2, 1] };
        assert_eq!(*seen.lock().unwrap(), asked, "broker speaking v{newest}");
        // A plain call goes as v1 and reads no subscriptions.
        let plain = Request::DescribeQueue(DescribeQueueRequest { name: "jobs".into() });
        let connection = admin.client().connection(&format!("127.0.0.1:{port}")).await.unwrap();
        let bytes = bounded(connection.call(&plain)).await.unwrap();
        let Response::DescribeQueue(answer) = bytes.response().unwrap() else { panic!("not it") };
        assert!(answer.subscriptions.is_empty());
        assert_eq!(seen.lock().unwrap().last(), Some(&1));
    }
}

// Goal: `Admin::create_queue` asks CreateQueue v1 for a queue without a
// retention window (old and new brokers create it) and v2 for one with a
// window; a broker from before windows refuses that v2, and the caller is
// told it does not know windows (nothing is created without one). Method:
// two fake nodes, one speaking CreateQueue up to v2 and one up to v1,
// recording the versions and windows they were asked.
#[tokio::test]
async fn create_asks_version_2_only_for_a_window() {
    for newest in [2u16, 1] {
        let seen: Arc<Mutex<Vec<(u16, u64)>>> = Arc::default();
        let handler = {
            let seen = Arc::clone(&seen);
            move |request: &Request<'_>, id, version: u16| match request {
                Request::Metadata(_) => {
                    let response =
                        MetadataResponse { assignment_version: VERSION, queues: Vec::new() };
                    encode(id, Response::Metadata(response))
                }
                Request::CreateQueue(create) => {
                    let mut out = Vec::new();
                    if version > newest {
                        ErrorResponse::new(
                            ErrorCode::UnsupportedVersion,
                            format!("api key 16 version {version} unsupported"),
                        )
                        .encode(id, ApiKey::CreateQueue.as_u16(), version, &mut out)
                        .unwrap();
                    } else {
                        seen.lock().unwrap().push((version, create.config.retention_ms));
                        let created =
                            CreateQueueResponse { assignment_version: AssignmentVersion(9) };
                        Response::CreateQueue(created)
                            .encode_version(id, version, &mut out)
                            .unwrap();
                    }
                    out
                }
                other => panic!("unexpected {other:?}"),
            }
        };
        let port = serve_versioned(Arc::new(handler)).await;
        let admin = Admin::new(Client::connect(&format!("127.0.0.1:{port}")).await.unwrap());
        bounded(admin.create_queue("plain", default_queue_config(1))).await.unwrap();
        let windowed = QueueConfig { retention_ms: 60_000, ..default_queue_config(1) };
        let answer = bounded(admin.create_queue("stream", windowed)).await;
        if newest == 2 {
            answer.unwrap();
            assert_eq!(*seen.lock().unwrap(), [(1, 0), (2, 60_000)]);
        } else {
            let error = answer.unwrap_err();
            assert_eq!(error.code(), Some(ErrorCode::UnsupportedVersion));
            let message = error.to_string();
            assert!(message.contains("does not know retention windows"), "{message}");
            assert!(message.contains("stream"), "{message}");
            assert_eq!(*seen.lock().unwrap(), [(1, 0)], "nothing created without its window");
        }
    }
}

// Goal: an enqueue goes as Enqueue v3 (it may be answered
// ACTIVE_KEYS_FULL); a broker from before v3 refuses that version without
// reading the records, the same request is sent once more as v2 and every
// later enqueue on that connection goes as v2 at once. Method: two fake
// nodes, one speaking Enqueue up to v3 and one up to v2, recording the
// versions they were asked; three enqueues each.
#[tokio::test]
async fn enqueue_asks_version_3_and_falls_back_to_version_2() {
    use spool_wire::batch::{DataBatchBuilder, MessageId, Payload, Record};
    use spool_wire::proto::{EnqueueResponse, Offset, RecordOutcome};
    let mut builder = DataBatchBuilder::new();
    builder
        .push(&Record {
            message_id: MessageId([7; 16]),
            routing_key: b"chair-4".to_vec(),
            headers: Vec::new(),
            payload: Payload::Inline(b"book 2:00".to_vec()),
            priority: 0,
            not_before_ms: 0,
            expiry_ms: 0,
            enqueue_time_ms: 1,
        })
        .unwrap();
    let batch = builder.finish().unwrap();
    for newest in [3u16, 2] {
        let seen: Arc<Mutex<Vec<u16>>> = Arc::default();
        let own_port = Arc::new(Mutex::new(0u16));
        let handler = {
            let (seen, own_port) = (Arc::clone(&seen), Arc::clone(&own_port));
            move |request: &Request<'_>, id, version: u16| match request {
                Request::Metadata(_) => partition_metadata(id, *own_port.lock().unwrap()),
                Request::Enqueue(_) => {
                    seen.lock().unwrap().push(version);
                    let mut out = Vec::new();
                    if version > newest {
                        ErrorResponse::new(ErrorCode::UnsupportedVersion, "v3 unknown")
                            .encode(id, ApiKey::Enqueue.as_u16(), version, &mut out)
                            .unwrap();
                    } else {
                        let appended = RecordOutcome::Appended { offset: Offset(5) };
                        let answer =
                            EnqueueResponse { base_offset: Offset(5), records: vec![appended] };
                        Response::Enqueue(answer).encode_version(id, version, &mut out).unwrap();
                    }
                    out
                }
                other => panic!("unexpected {other:?}"),
            }
        };
        let port = serve_versioned(Arc::new(handler)).await;
        *own_port.lock().unwrap() = port;
        let client = Client::connect(&format!("127.0.0.1:{port}")).await.unwrap();
        for _ in 0..3 {
            let answer = bounded(client.enqueue("jobs", PartitionId(0), &batch)).await.unwrap();
            assert_eq!(answer.base_offset, Offset(5));
        }
        let asked = if newest == 3 { vec![3, 3, 3] } else { vec![3, 2, 2, 2] };
        assert_eq!(*seen.lock().unwrap(), asked, "broker speaking v{newest}");
    }
}
