package admin

import (
	"net/http"
	"reflect"
	"strconv"
)

// opDoc is the OpenAPI description of a route.
type opDoc struct {
	id      string
	tag     string
	summary string
	desc    string
	query   []queryParam
	// body is the JSON request body's type; nil for none.
	body reflect.Type
	// bodyOptional says the body may be absent.
	bodyOptional bool
	// rawBody says any non-JSON content type is accepted as a raw payload (publish).
	rawBody bool
	// ok is the success status; resp its JSON body type (nil: no body, or see contentType).
	ok   int
	resp reflect.Type
	// contentType of a non-JSON success body ("text/plain" for /metrics).
	contentType string
	// errs are the error statuses the route answers with (besides 500).
	errs []int
}

type queryParam struct {
	name, typ, desc string
}

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }

// Error statuses common to the API routes that read the broker.
var (
	errsRead = []int{http.StatusBadRequest, http.StatusNotFound, http.StatusServiceUnavailable}
	// errsWrite adds what checkMutation refuses: cross-origin browser requests (403) and bodies
	// that are not JSON (415).
	errsWrite = []int{http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusServiceUnavailable}
)

// routeTable lists every route of the handler. The OpenAPI document is built from it.
func (h *Handler) routeTable() []*route {
	paging := []queryParam{
		{"limit", "integer", "page size, 0 to 1000 (default 100)"},
		{"offset", "integer", "topics to skip"},
	}
	routes := []*route{
		// Probes and metrics.
		{method: "GET", path: "/healthz", handle: h.healthz, doc: opDoc{
			id: "healthz", tag: "health", summary: "Liveness: the process serves HTTP.",
			ok: 200, resp: typeOf[Status]()}},
		{method: "GET", path: "/readyz", handle: h.readyz, doc: opDoc{
			id: "readyz", tag: "health", summary: "Readiness: the engine is open, the broker running, the storage not full, and the server not shutting down.",
			desc: "503 with the reason otherwise: the broker starting or stopped, or its engine not answering a cheap read (CLOSED, STORAGE_UNAVAILABLE, TIMEOUT...); " +
				"STORAGE_FULL while publishes are refused for lack of space (until a publish is stored, or 10 s after the last refusal); " +
				"and CLOSED from the start of a graceful shutdown of spool serve, so that load balancers stop sending before the listeners close. " +
				"A ready answer's detail says when a cleanup job falls behind.",
			ok: 200, resp: typeOf[Status](), errs: []int{http.StatusServiceUnavailable}}},
		{method: "GET", path: "/metrics", handle: h.serveMetrics, doc: opDoc{
			id: "metrics", tag: "health", summary: "Prometheus metrics (text exposition format).",
			desc: "queue_depth{topic}, consumer_lag{topic,group}, message_throughput{topic} and the spool_* metrics; see internal/metrics.",
			ok:   200, contentType: "text/plain", errs: []int{http.StatusNotFound}}},
		{method: "GET", path: "/api/v1/openapi.json", handle: h.serveOpenAPI, doc: opDoc{
			id: "openapi", tag: "health", summary: "This OpenAPI 3 document.",
			ok: 200, contentType: "application/json"}},

		{method: "GET", path: "/api/v1/cleanup", handle: h.listCleanup, doc: opDoc{
			id: "listCleanup", tag: "health", summary: "The broker's cleanup jobs: runs, failures, what they removed, their backlog, and whether they fall behind.",
			desc: "Jobs: retention (message cleanup) and subscription_lifecycle (dead detection, CANCELLED to DELETED). backlog is what a job could remove now and has not (retention: messages in whole segments or buckets). A job falls behind (seed 000's CRITICAL rule) without a successful run for 3 intervals, when its last run took longer than its interval, or when its backlog grew at each of its last 3 runs; warning (seed 000's WARNING rule) is a backlog above 1,000,000 messages. /readyz stays ready and says either in detail.",
			ok:   200, resp: typeOf[CleanupList](), errs: errsRead}},

		// Topics.
		{method: "GET", path: "/api/v1/topics", handle: h.listTopics, doc: opDoc{
			id: "listTopics", tag: "topics", summary: "List topics with their statistics.",
			query: append(paging, queryParam{"pattern", "string", "only topics matching this name or wildcard pattern"}),
			ok:    200, resp: typeOf[TopicList](), errs: errsRead}},
		{method: "POST", path: "/api/v1/topics", handle: h.createTopic, doc: opDoc{
			id: "createTopic", tag: "topics", summary: "Create a topic.",
			desc: "Absent configuration fields take the defaults (BRIEF.md section 5).",
			body: typeOf[CreateTopicRequest](), ok: 201, resp: typeOf[Topic](), errs: errsWrite}},
		{method: "GET", path: "/api/v1/topics/{topic}", handle: h.getTopic, doc: opDoc{
			id: "getTopic", tag: "topics", summary: "Get a topic with its statistics.",
			ok: 200, resp: typeOf[Topic](), errs: errsRead}},
		{method: "PUT", path: "/api/v1/topics/{topic}/config", handle: h.updateTopicConfig, doc: opDoc{
			id: "updateTopicConfig", tag: "topics", summary: "Change a topic's configuration.",
			desc: "Fields absent from the body keep their values. Partitions only grow. QUEUE to PUB_SUB needs queue_to_group, the group the queue subscription becomes; queue_to_group with any other update is INVALID_ARGUMENT. " +
				"Concurrent updates of different fields all take effect: an update that lands between this request's read of the configuration and its write makes the server apply the body again to a fresh read, up to " + strconv.Itoa(topicUpdateAttempts) + " times, then answer 409 TOPIC_CHANGED having changed nothing.",
			body: typeOf[UpdateTopicRequest](), ok: 200, resp: typeOf[Topic](), errs: errsWrite}},
		{method: "DELETE", path: "/api/v1/topics/{topic}", handle: h.deleteTopic, doc: opDoc{
			id: "deleteTopic", tag: "topics", summary: "Delete a topic with its messages and subscriptions.",
			desc:  "Refused with 409 TOPIC_HAS_SUBSCRIPTIONS while live durable subscriptions exist, unless force=true, which cancels them.",
			query: []queryParam{{"force", "boolean", "cancel live subscriptions"}},
			ok:    204, errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/messages", publish: true, handle: h.publish, doc: opDoc{
			id: "publish", tag: "messages", summary: "Publish messages.",
			desc: "A JSON body is one message or {\"messages\": [...]}, all or nothing ({} or an empty list is refused); the topic is auto-created unless auto-create is off. " +
				"Any other Content-Type publishes the raw body as one message's payload (query parameters key and partition), except text/plain, form data and multipart (415).",
			query: []queryParam{{"key", "string", "raw body only: the message key"}, {"partition", "integer", "raw body only: the partition"}},
			body:  typeOf[PublishRequest](), rawBody: true,
			ok: 201, resp: typeOf[PublishResult](), errs: errsWrite}},

		{method: "GET", path: "/api/v1/topics/{topic}/messages", handle: h.readMessages, doc: opDoc{
			id: "readMessages", tag: "messages", summary: "Read a partition's retained messages without consuming them.",
			desc: "Changes no delivery state (no lease, cursor or ack). Needs the consume or admin permission on the topic. " +
				"next_offset is the from of the next page. A page holds at most 4 MiB of messages (key, headers and payload; at least one message), " +
				"so it can be shorter than limit before the end: read on from next_offset until a page is empty.",
			query: []queryParam{{"partition", "integer", "the partition (default 0, or the one of a partition:offset from)"},
				{"from", "string", "an offset, a message id (partition:offset) or an RFC 3339 time (the first message published at or after it); default: the first retained message"},
				{"limit", "integer", "page size, 1 to 1000 (default 100)"}},
			ok: 200, resp: typeOf[MessageList](), errs: errsRead}},
		{method: "GET", path: "/api/v1/topics/{topic}/messages/{id}/completion", handle: h.messageCompletion, doc: opDoc{
			id: "messageCompletion", tag: "messages", summary: "A message's completion record (completion_tracking refcount).",
			desc: "The groups the message waits or waited for (those live when it was published, plus those that joined while it was pending), " +
				"each pending, acked, dead_lettered or removed (it left the set while the message was pending: DEAD or CANCELLED), with the time. " +
				"{id} is the message id (offset, or partition:offset). A watermark topic is refused (400 INVALID_ARGUMENT), a message retention " +
				"removed too (400 OFFSET_OUT_OF_RANGE). Needs the consume or admin permission on the topic.",
			ok: 200, resp: typeOf[MessageCompletion](), errs: errsRead}},

		// Groups (subscriptions).
		{method: "GET", path: "/api/v1/groups", handle: h.listGroups, doc: opDoc{
			id: "listGroups", tag: "groups", summary: "List subscriptions (consumer groups on topics) with their health.",
			desc: "Ordered by subscription ID, one page at a time: next_after_id, absent on the last page, is the after_id of the next. " +
				"Members carry subscription_count, not their subscription IDs (GET /api/v1/members has them).",
			query: []queryParam{{"topic", "string", "only this topic"}, {"group", "string", "only this group"},
				{"state", "string", "only this state: ACTIVE, PAUSED, DEAD or CANCELLED"},
				{"limit", "integer", "page size, 0 to 1000 (default 100)"},
				{"after_id", "integer", "start after this subscription ID (next_after_id of the previous page)"}},
			ok: 200, resp: typeOf[GroupList](), errs: errsRead}},
		{method: "GET", path: "/api/v1/topics/{topic}/groups", handle: h.listTopicGroups, doc: opDoc{
			id: "listTopicGroups", tag: "groups", summary: "List the subscriptions of a topic with their health.",
			desc: "Ordered by subscription ID, at most 1000 a page: next_after_id, absent on the last page, is the after_id of the next. " +
				"Members carry subscription_count, not their subscription IDs (GET /api/v1/members has them).",
			query: []queryParam{{"group", "string", "only this group"},
				{"state", "string", "only this state: ACTIVE, PAUSED, DEAD or CANCELLED"},
				{"limit", "integer", "page size, 0 to 1000 (default and 0: 1000)"},
				{"after_id", "integer", "start after this subscription ID (next_after_id of the previous page)"}},
			ok: 200, resp: typeOf[GroupList](), errs: errsRead}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups", handle: h.createGroup, doc: opDoc{
			id: "createGroup", tag: "groups", summary: "Create a consumer group on a PUB_SUB topic ahead of its consumers.",
			desc: "Messages from its start on are kept for it until its consumers subscribe. A group without a live consumer for its heartbeat_timeout becomes DEAD (a consumer subscribing makes it ACTIVE again). 409 SUBSCRIPTION_EXISTS when the group is already subscribed; 400 on a QUEUE topic.",
			body: typeOf[CreateGroupRequest](), ok: 201, resp: typeOf[Group](), errs: errsWrite}},
		{method: "PUT", path: "/api/v1/topics/{topic}/groups/{group}/config", handle: h.updateGroup, doc: opDoc{
			id: "updateGroup", tag: "groups", summary: "Change a group's start position (before it delivered anything) or heartbeat timeout.",
			desc: "A new start after the group delivered, acked or dead-lettered a message is refused with 409 INVALID_TRANSITION and changes nothing.",
			body: typeOf[UpdateGroupRequest](), ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "GET", path: "/api/v1/topics/{topic}/groups/{group}", handle: h.getGroup, doc: opDoc{
			id: "getGroup", tag: "groups", summary: "Get a subscription with its health.",
			desc: "group is the consumer group, $queue for the subscription of a QUEUE topic.",
			ok:   200, resp: typeOf[Group](), errs: errsRead}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/rebalance", handle: h.rebalanceGroup, doc: opDoc{
			id: "rebalanceGroup", tag: "groups", summary: "Rebalance an ordered group now, optionally with a new strategy.",
			desc: "The body is optional: strategy (round-robin or sticky) becomes the group's; drop_foreign leaves out the members other broker instances listed (to take the partitions of an instance that crashed). Answers the group with its new generation and assignment. 400 for a shared group.",
			body: typeOf[RebalanceRequest](), ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/pause", handle: h.groupOp(h.b.PauseGroup), doc: opDoc{
			id: "pauseGroup", tag: "groups", summary: "Pause a subscription: it receives nothing and keeps holding retention.",
			ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/resume", handle: h.groupOp(h.b.ResumeGroup), doc: opDoc{
			id: "resumeGroup", tag: "groups", summary: "Resume a PAUSED subscription, or a DEAD one with the bounded backfill of what it missed (as resurrect with backfill).",
			ok: 200, resp: typeOf[Group](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/cancel", handle: h.groupOp(h.b.CancelGroup), doc: opDoc{
			id: "cancelGroup", tag: "groups", summary: "Cancel a subscription: it releases everything; terminal.",
			ok: 200, resp: typeOf[Group](), errs: errsWrite}},

		// Dead-letter queues.
		{method: "GET", path: "/api/v1/topics/{topic}/groups/{group}/dlq", handle: h.listDLQ, doc: opDoc{
			id: "listDLQ", tag: "dlq", summary: "List a subscription's dead-lettered messages in id order.",
			desc: "A page holds at most 4 MiB of messages (key, headers and, unless payload=false, payload; at least one entry), " +
				"so it can be shorter than limit with next_after_id set: page on while next_after_id is given.",
			query: []queryParam{{"after_id", "integer", "entries with a larger id (paging: next_after_id)"},
				{"limit", "integer", "page size, 1 to 1000 (default 100)"},
				{"payload", "boolean", "false leaves each message's payload out and gives payload_bytes, its size, instead (default true)"}},
			ok: 200, resp: typeOf[DLQList](), errs: errsRead}},
		{method: "GET", path: "/api/v1/topics/{topic}/groups/{group}/dlq/{id}", handle: h.getDLQEntry, doc: opDoc{
			id: "getDLQEntry", tag: "dlq", summary: "Get one DLQ entry.",
			ok: 200, resp: typeOf[DLQEntry](), errs: errsRead}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/dlq/replay", handle: h.replayDLQ, doc: opDoc{
			id: "replayDLQ", tag: "dlq", summary: "Replay DLQ entries to this subscription only, due at once with a fresh attempt count.",
			body: typeOf[DLQSelection](), ok: 200, resp: typeOf[DLQResult](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/dlq/purge", handle: h.purgeDLQ, doc: opDoc{
			id: "purgeDLQ", tag: "dlq", summary: "Remove DLQ entries.",
			body: typeOf[DLQSelection](), ok: 200, resp: typeOf[DLQResult](), errs: errsWrite}},

		// Pull consumption.
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/pull", handle: h.pull, doc: opDoc{
			id: "pull", tag: "consume", summary: "Lease up to max messages to the caller, waiting up to wait for the first.",
			desc: "Returns as soon as a message is there, with up to max and at most 4 MiB of messages (at least one; " +
				"what is left stays leased to the session for the next pull); an empty list when none arrived within wait. " +
				"Ack or nack each message before lease_deadline, else it is redelivered. group is a consumer group " +
				"($queue, or any group, on a QUEUE topic). A PUB_SUB group's subscription is created at the first pull, at start. " +
				"Each (topic, group, filter) pulled holds a session until 10 s past its last use; past 1024 sessions, or 64 of one group (the defaults), 409 LIMIT_EXCEEDED.",
			body: typeOf[PullRequest](), bodyOptional: true, ok: 200, resp: typeOf[PullResult](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/ack", handle: h.ack, doc: opDoc{
			id: "ack", tag: "consume", summary: "Ack pulled messages (idempotent; works without the lease).",
			desc: "Refs that name no message (above the partition's high-water mark, or in a partition the topic lacks) answer 400 INVALID_ARGUMENT " +
				"saying how many: the others are acked (acks are idempotent, so the request may be sent again without them).",
			body: typeOf[RefsRequest](), ok: 200, resp: typeOf[AckResult](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/nack", handle: h.nack, doc: opDoc{
			id: "nack", tag: "consume", summary: "Give pulled messages back: redelivered after delay, or dead-lettered with to_dlq.",
			desc: "Needs the lease: 409 LEASE_NOT_HELD for messages whose lease expired or that were settled (the others are nacked).",
			body: typeOf[NackRequest](), ok: 200, resp: typeOf[AckResult](), errs: errsWrite}},
		{method: "POST", path: "/api/v1/topics/{topic}/groups/{group}/extend", handle: h.extend, doc: opDoc{
			id: "extend", tag: "consume", summary: "Extend the leases of pulled messages.",
			body: typeOf[ExtendRequest](), ok: 200, resp: typeOf[ExtendResult](), errs: errsWrite}},

		// Bindings and members.
		{method: "GET", path: "/api/v1/bindings", handle: h.listBindings, doc: opDoc{
			id: "listBindings", tag: "groups", summary: "List the durable groups' pattern bindings.",
			ok: 200, resp: typeOf[BindingList](), errs: errsRead}},
		{method: "DELETE", path: "/api/v1/bindings/{group}/{pattern}", handle: h.deleteBinding, doc: opDoc{
			id: "deleteBinding", tag: "groups", summary: "Delete a binding: topics created later no longer get a subscription for the group.",
			desc: "Percent-encode '#' in the pattern as %23. Subscriptions the binding created stay.",
			ok:   204, errs: errsWrite}},
		{method: "GET", path: "/api/v1/members", handle: h.listMembers, doc: opDoc{
			id: "listMembers", tag: "groups", summary: "List the live members (consumers) of this broker.",
			ok: 200, resp: typeOf[MemberList]()}},

		// Seed 002 paths.
		{method: "GET", path: "/admin/topics", handle: h.seedTopics, doc: opDoc{
			id: "seedTopics", tag: "seed", summary: "Seed 002 M4-2: topics with subscriber counts.",
			ok: 200, resp: typeOf[SeedTopics](), errs: errsRead}},
		{method: "GET", path: "/admin/groups", handle: h.seedGroups, doc: opDoc{
			id: "seedGroups", tag: "seed", summary: "Seed 002 M4-3: groups (one entry per subscription) with member counts.",
			desc: "Consumers carry subscription_count, not their subscription IDs (GET /api/v1/members has them).",
			ok:   200, resp: typeOf[SeedGroups](), errs: errsRead}},
		{method: "POST", path: "/admin/dlq/replay", handle: h.seedReplay, doc: opDoc{
			id: "seedReplay", tag: "seed", summary: "Seed 002 M4-6: replay DLQ entries to the group that dead-lettered them.",
			desc: "Accepts {\"topic\",\"group\",\"ids\"|\"all\"} or the seed's {\"message_id\":\"dlq-12\",\"target_topic\":\"orders\"}.",
			body: typeOf[SeedReplayRequest](), ok: 200, resp: typeOf[SeedReplayResult](), errs: errsWrite}},
		{method: "POST", path: "/publish", publish: true, curlForm: true, handle: h.seedPublish, doc: opDoc{
			id: "seedPublish", tag: "seed", summary: "Seed 002 M1-18: publish one message, {\"topic\": \"test\", \"message\": \"hello\"}.",
			desc: "A string message is stored as its text, any other JSON value as its JSON. Needs publish on the topic; priority on it exempts from its backpressure. " +
				"The JSON body may come as application/x-www-form-urlencoded (curl -d, as in the seed's check).",
			body: typeOf[SeedPublishRequest](), ok: 201, resp: typeOf[PublishResult](), errs: errsWrite}},
		{method: "GET", path: "/admin/pending", handle: h.seedPending, doc: opDoc{
			id: "seedPending", tag: "seed", summary: "Seed 002: deliveries leased to this broker's consumers, earliest deadline first.",
			query: []queryParam{{"limit", "integer", "the most entries, 0 to 1000 (default 100)"}},
			ok:    200, resp: typeOf[SeedPendingList](), errs: errsRead}},
		{method: "GET", path: "/admin/connections", handle: h.seedConnections, doc: opDoc{
			id: "seedConnections", tag: "seed", summary: "Seed 002: the TCP server's client connections.",
			ok: 200, resp: typeOf[SeedConnections]()}},
		{method: "GET", path: "/api/v1/metrics/topics", handle: h.seedTopicMetrics, doc: opDoc{
			id: "seedTopicMetrics", tag: "seed", summary: "Seed 002 M4-9: message counts per topic (published_total's rate is the throughput).",
			query: []queryParam{{"topic_pattern", "string", "only topics matching this name or wildcard pattern"}},
			ok:    200, resp: typeOf[SeedTopicMetricsList](), errs: errsRead}},
		{method: "GET", path: "/api/v1/health/consumers", handle: h.seedConsumerHealth, doc: opDoc{
			id: "seedConsumerHealth", tag: "seed", summary: "Seed 002 M4-10: consumer groups with their health (healthy: ACTIVE with a live consumer).",
			query: []queryParam{{"group_name", "string", "only this group"}},
			ok:    200, resp: typeOf[SeedConsumerHealthList](), errs: errsRead}},
	}
	return append(routes, h.groupAdminRoutes()...)
}
