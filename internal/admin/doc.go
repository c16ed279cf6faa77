// Package admin is Spool's HTTP API: an http.Handler the server mounts on its HTTP listener (port
// 8080 by default). It serves
//
//   - the versioned REST API under /api/v1: topics (list, create, get with statistics, change the
//     configuration, delete), subscriptions ("groups": list with health, get, pause, resume,
//     cancel, and seed 000's admin operations: remove, resurrect, force-complete), dead-letter queues per subscription (list, get, replay to that subscription only,
//     purge), bindings, live members, publish over HTTP and pull-consume over HTTP (pull, ack,
//     nack, extend) for languages without a client, and reading a partition's messages without
//     consuming them (GET /api/v1/topics/{topic}/messages?partition=&from=&limit=: from an
//     offset, a message id or a time; consume or admin permission; no delivery state changes),
//     and a refcount topic's completion record of a message (GET
//     /api/v1/topics/{topic}/messages/{id}/completion, the same permission);
//   - the seed 002 paths GET /admin/topics, GET /admin/groups, POST /admin/dlq/replay,
//     POST /publish, GET /admin/pending, GET /admin/connections, GET /api/v1/metrics/topics and
//     GET /api/v1/health/consumers;
//   - GET /metrics (Prometheus, promhttp over Config.Gatherer), GET /healthz (the process serves),
//     GET /readyz (Config.Ready: by default the broker is running and its engine answers);
//   - its own OpenAPI 3 document at GET /api/v1/openapi.json, generated from the route table and
//     the Go types of the bodies (see buildOpenAPI), so it cannot drift from the handlers.
//
// Handler.Routes lists the routes; the OpenAPI document describes each one with its parameters,
// bodies and error statuses. The bodies of the topic, group, cleanup and completion routes and
// of errors are the types of the public package client/admin (the Go client of this API),
// aliased here (Group = api.Group, ...): the server converts the engine's and the broker's
// values to them, so the JSON a client decodes is defined in one place.
//
// # Addressing subscriptions
//
// A subscription is (topic, group) in the URL: /api/v1/topics/{topic}/groups/{group}. The one
// subscription of a QUEUE topic is the group "$queue"; an ephemeral subscription has the group the
// engine gave it ("$ephemeral-<id>"). Topic names contain no '/', so they fit one path segment.
// A binding's pattern may contain '#', which must be percent-encoded (%23) in a URL.
//
// # Errors
//
// Every error is JSON: {"error":{"code":"TOPIC_NOT_FOUND","message":"...","retryable":false}}.
// Storage and broker errors are mapped to the wire protocol's error table by errmap.ErrorFrom (the
// same mapping the TCP server uses), and the code's HTTP status is: 400 INVALID_ARGUMENT (also
// malformed JSON, unknown fields, bad query parameters), OFFSET_OUT_OF_RANGE; 404
// TOPIC_NOT_FOUND, SUBSCRIPTION_NOT_FOUND, BINDING_NOT_FOUND; 409 TOPIC_EXISTS,
// TOPIC_HAS_SUBSCRIPTIONS, NO_SUBSCRIPTIONS, SUBSCRIPTION_EXISTS, SUBSCRIPTION_NOT_ACTIVE,
// INVALID_TRANSITION, LEASE_NOT_HELD, BINDING_EXISTS, STALE_GENERATION, LIMIT_EXCEEDED,
// TOPIC_CHANGED; 413 MESSAGE_TOO_LARGE, FRAME_TOO_LARGE (a request body over the limit); 429
// RATE_LIMITED; 503 CLOSED (broker stopped, engine closed), OVERLOADED, STORAGE_UNAVAILABLE; 507
// STORAGE_FULL; 504 TIMEOUT; 500 INTERNAL. Only in HTTP: 403 FORBIDDEN, 415
// UNSUPPORTED_MEDIA_TYPE and 421 MISDIRECTED_REQUEST (requests from browsers, see below),
// NOT_FOUND (no such route, no such DLQ entry) and METHOD_NOT_ALLOWED (405, with an Allow header).
//
// # Limits
//
// Request bodies are bounded by Config.MaxBodyBytes (1 MiB), publishes by
// Config.MaxPublishBodyBytes (16 MiB: the 10 MiB frame limit of the wire protocol plus base64);
// each message is still bounded by its topic's max_message_bytes. A publish carries at most
// 10,000 messages, a pull returns at most Config.PullMaxBatch (100) and waits at most
// Config.MaxPullWait (30 s: the HTTP server's WriteTimeout must be longer). List pages hold at most
// 1000 entries. A message read, a DLQ list and a pull answer at most 4 MiB of messages (key,
// headers and payload; at least one message; maxResponseBytes) whatever limit or max asks: the
// page ends early with its cursor set (next_offset, next_after_id; a pull's rest waits, leased, for
// the next pull). JSON bodies reject unknown fields.
//
// Request bodies are bounded in size (Config.MaxBodyBytes, 1 MiB; publishes
// Config.MaxPublishBodyBytes, 16 MiB: 413 FRAME_TOO_LARGE) and in time (Config.BodyReadTimeout,
// 30 s from the start of the handler: 408 SESSION_TIMEOUT). NewServer adds the header timeout
// (10 s), the write timeout (longer than the longest pull) and the idle timeout of keep-alive
// connections (2 min); LimitListener bounds the open connections (spool serve:
// http_max_connections, 1024) and answers one more with 503 OVERLOADED, Retry-After: 1.
//
// # Publish
//
// POST /api/v1/topics/{topic}/messages takes one message or {"messages": [...]} (all or
// nothing); a body with no message ({} or an empty list) is refused. Payload and key are given as text (payload, key) or base64 (payload_base64,
// key_base64); responses give them as text when they are valid UTF-8 and as base64 otherwise.
// A body with another Content-Type than JSON is published as the payload of one message
// (curl --data-binary @file -H 'Content-Type: application/octet-stream'), except the types a web
// page may send to another site without asking it first (text/plain, form data, multipart): 415.
// A JSON message may carry a producer_id: a message whose producer_id the topic saw within its
// dedup_window (default 2 min) is not stored again, and its entry in the answer is the first
// message's, with "duplicate": true.
// A topic at its backlog bound (max_backlog_messages / max_backlog_bytes) answers 429
// RATE_LIMITED with Retry-After; a principal with the priority permission on the topic is exempt.
// The topic's GET answer then has "backpressure" (state, backlog, delay, retry_after, and the
// publishes throttled and rejected since the broker started).
//
// # Requests from browsers (CSRF)
//
// A web page must not be able to drive the API through a visitor's browser. Every request but GET,
// HEAD and OPTIONS is refused with 403 FORBIDDEN when the browser marks it cross-origin
// (Sec-Fetch-Site, or an Origin header whose host is not the request's Host:
// http.CrossOriginProtection), and with 415 UNSUPPORTED_MEDIA_TYPE when it carries a body that is
// not JSON (but for the raw publish above). Requests without those headers (curl, the CLI, other
// programs) and same-origin pages are served as before. This does not replace authentication.
//
// DNS rebinding makes a page's requests same-origin to the browser; they still name the page's
// host. Without authentication, a request, on whatever address it arrived, must name localhost
// (or a name under .localhost), an IP address, the machine's host name or one of
// Config.AllowedHosts in its Host header, else 421 MISDIRECTED_REQUEST (LocalHost; the pprof
// debug listener always checks). Probes and scrapes by IP address or localhost pass; a scrape by
// another name needs it in Config.AllowedHosts.
//
// # Authentication
//
// With Config.Auth set, every route but /healthz, /readyz, the OpenAPI document and (unless
// auth.open_metrics is off) /metrics needs a principal, named by "Authorization: Bearer <token>"
// or by the verified client certificate's common name, with the route's permission: publish on
// the topic for the publish route, consume on the topic and group for pull, ack, nack and extend,
// admin on the topic for the other routes with a topic, admin on "#" for those without one. The
// check runs before the CSRF check and the handler: 401 NOT_AUTHENTICATED (with
// WWW-Authenticate: Bearer) or 403 PERMISSION_DENIED, logged and counted (see authorize).
//
// # Pull
//
// The broker has no pull primitive: deliveries go to members, and a member that leaves
// (Member.Close) releases every lease it holds, so a member opened and closed per request would
// take back at once the leases of the messages it just handed out. Pull consumption is therefore
// served by a pull session per (topic, group) of the URL and member filter of the request body
// ("filter", empty for none; nack and extend name it too): a broker member (id "http-pull-...")
// that lives across requests and claims on demand. At most Config.MaxPullSessions (1024) are
// open, and Config.MaxGroupPullSessions (64) of one (topic, group), those being opened included;
// a pull that needs one more gets 409 LIMIT_EXCEEDED and makes no member.
//
//   - Its credit (Member.SetMaxInFlight) is 0 while no pull waits: it keeps its leases and claims
//     nothing, so messages nobody asked for stay with the group's other members. A pull raises it
//     to what the member holds plus what the pull asks for (bounded by Config.PullMaxInFlight),
//     waits up to wait (at least 100 ms, one claim round) for the first delivery, and lowers it
//     again. What a claim brings beyond what the pulls took (a race between a claim and the last
//     waiting pull giving up) stays in the session's buffer for the next pull.
//   - The deliveries are handed out with their lease; a lease with less than half of the topic's
//     ack_wait left is extended to a full ack_wait first. The first pull of a PUB_SUB group without
//     a subscription creates it at the request's start position.
//   - Ack needs no session: any member may ack (Broker.AckBatch), so it works after the session
//     closed and through another broker instance. Nack and extend need the lease holder, the
//     session's member: without a live session they fail with LEASE_NOT_HELD.
//   - A buffered delivery's lease is extended at half of ack_wait while it waits, so waiting in the
//     session costs it no delivery attempt.
//   - The session closes after Config.PullIdleTimeout without requests, once no lease it handed out
//     is live (acked, nacked or expired), never while an HTTP consumer holds a live lease from it:
//     its member leaves and releases what it still holds (buffered deliveries go back to the group
//     at once, their attempt counts kept). A subscription ending under it (cancelled group, deleted
//     topic) closes it too; a later pull subscribes again (for a cancelled PUB_SUB group that
//     creates a new subscription, as a reconnecting client would).
//
// Limits: sessions live in this process (on PostgreSQL with several broker instances behind a load
// balancer, a nack or extend must reach the instance that served the pull, or it fails with
// LEASE_NOT_HELD and the message is redelivered when its lease expires); buffered deliveries wait
// for the next pull or the session's close, at most the lease time of the HTTP consumer holding
// the session open; the lease of pulled messages is the topic's ack_wait (no per-request lease).
// Handler.Close ends every session (their leases are released and redelivered at once).
//
// # Listings at scale
//
// The listings read each topic's or subscription's figures once: GET /api/v1/topics,
// GET /admin/topics and /metrics cost is linear in topics plus subscriptions (at 10,000 topics
// and 12,000 subscriptions on the embedded engine: 17-45 ms; /metrics 0.4 s, mostly building and
// encoding its 170,000 series), and no listing holds a broker or engine lock for more than one
// topic or subscription at a time, so publishing and dispatch go on. GET /api/v1/topics pages with
// limit and offset, but still reads every topic's figures (to filter by pattern and count total);
// GET /api/v1/groups and GET /api/v1/topics/{topic}/groups page with limit and after_id
// (subscription ID) and read the figures of their page only. A member appears in the group listings once per subscription it
// is attached to, with its subscription_count but not its subscription IDs (a wildcard member on n
// topics would repeat n IDs n times); GET /api/v1/members and the single-group GET list them.
//
// # Seed paths
//
// GET /admin/topics lists topics with "subscribers" (consumers attached here), "subscriptions"
// (groups), messages, bytes and queue_depth. GET /admin/groups lists one entry per subscription
// (topic, group) with "members" (the count), "consumers" (each member's credit and held
// deliveries), pending, lag, in_flight and dead_lettered. POST /admin/dlq/replay takes
// {"topic","group","ids"|"all"} or the seed's {"message_id":"dlq-12","target_topic":"orders"};
// see SeedReplayRequest for how the seed shape is mapped, and why a replay redelivers the message
// to its group instead of publishing a copy with a new id.
//
// POST /publish takes {"topic","message"} (also sent as application/x-www-form-urlencoded, as
// curl -d sends it; cross-origin browser requests are still refused) and needs publish on that
// topic. GET /admin/pending lists the deliveries leased to this broker's consumers (message id,
// topic, group, consumer, lease deadline; not the attempt number, which the broker does not keep
// per lease), earliest deadline first. GET /admin/connections lists the TCP connections (remote
// address, mode, protocol version, client name, opened and duration, members; no heartbeat
// status). GET /api/v1/metrics/topics?topic_pattern= gives per topic retained messages,
// published_total (whose rate is the throughput; no rate is computed), bytes, queue_depth,
// subscriptions and consumers. GET /api/v1/health/consumers?group_name= gives each group's state,
// healthy (ACTIVE with a consumer on this broker), status (healthy, no_consumers, paused, dead,
// cancelled), consumers, pending and in_flight: a consumer that dies leaves its group at once
// (or after the session timeout), its leases released, so the group shows no_consumers.
//
// # Not served
//
// Seed 002 also names /api/v1/metrics (other than topics), /api/v1/health (other than consumers),
// member-removal endpoints and CORS. (Rebalancing an ordered group is POST
// .../groups/{group}/rebalance; a group's last heartbeat, processed count and oldest unacked age
// are in its JSON.)
package admin
