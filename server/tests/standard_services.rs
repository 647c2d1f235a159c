//! The standard gRPC health and reflection services answer, so grpcurl and
//! load balancers work against a broker.

use std::time::Duration;

use keel_server::local_cluster::LocalCluster;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_answer() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut cluster = LocalCluster::start(dir.path().to_path_buf(), 1, |_| {}).await.unwrap();
    cluster
        .eventually("registered", Duration::from_secs(30), |c| c.node(1).unwrap().metadata().brokers().len() == 1)
        .await
        .unwrap();
    let address = cluster.node(1).unwrap().metadata().brokers().values().next().unwrap().address.clone();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();

    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest { service: "keel.v1.Keel".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream_once(request))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().expect("a reflection reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reply {reply:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"keel.v1.Keel".to_string()), "{names:?}");
    cluster.shutdown().await;
}

/// A request stream of one message.
fn tokio_stream_once(
    request: ServerReflectionRequest,
) -> impl tonic::codegen::tokio_stream::Stream<Item = ServerReflectionRequest> {
    tonic::codegen::tokio_stream::iter([request])
}
