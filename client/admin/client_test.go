package admin_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/storage"
)

// wantAPIError fails the test unless err is an *admin.APIError with this status and code.
func wantAPIError(t *testing.T, what string, err error, status int, code string) {
	t.Helper()
	var ae *admin.APIError
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code || ae.Message == "" {
		t.Fatalf("%s: error %v (%#v), want %d %s with a message", what, err, ae, status, code)
	}
}

// TestGroupLifecycle drives the group operations against a real broker: create, list (paged),
// the completion record, DEAD -> resurrect with backfill, cancel/resume the backfill, update,
// force-complete, remove, and the API's error codes on the way.
func TestGroupLifecycle(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c, err := admin.NewClient(b.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := c.CreateTopic(ctx, "orders", admin.TopicConfig{Semantics: admin.PubSub, CompletionTracking: admin.Refcount})
	if err != nil || tp.Name != "orders" || tp.Config.CompletionTracking != admin.Refcount {
		t.Fatalf("CreateTopic: %+v, %v", tp, err)
	}
	_, err = c.CreateTopic(ctx, "orders", admin.TopicConfig{})
	wantAPIError(t, "second CreateTopic", err, http.StatusConflict, "TOPIC_EXISTS")

	billing, err := c.CreateGroup(ctx, "orders", admin.CreateGroupRequest{Group: "billing"})
	if err != nil || billing.State != admin.Active || billing.Start.Kind != admin.FromNow {
		t.Fatalf("CreateGroup billing: %+v, %v", billing, err)
	}
	audit, err := c.CreateGroup(ctx, "orders", admin.CreateGroupRequest{Group: "audit",
		Start: admin.StartPosition{Kind: admin.FromBeginning}, HeartbeatTimeout: admin.Duration(time.Minute), MaxBackfillMessages: 10})
	if err != nil || audit.Start.Kind != admin.FromBeginning || time.Duration(audit.HeartbeatTimeout) != time.Minute {
		t.Fatalf("CreateGroup audit: %+v, %v", audit, err)
	}
	_, err = c.CreateGroup(ctx, "orders", admin.CreateGroupRequest{Group: "audit"})
	wantAPIError(t, "second CreateGroup", err, http.StatusConflict, "SUBSCRIPTION_EXISTS")

	// Two pages of one group each, in subscription ID order.
	p1, err := c.ListGroups(ctx, admin.ListGroupsParams{Topic: "orders", Limit: 1})
	if err != nil || len(p1.Groups) != 1 || p1.Groups[0].Group != "billing" || p1.NextAfterID == nil {
		t.Fatalf("ListGroups page 1: %+v, %v", p1, err)
	}
	p2, err := c.ListGroups(ctx, admin.ListGroupsParams{Topic: "orders", Limit: 1, AfterID: *p1.NextAfterID})
	if err != nil || len(p2.Groups) != 1 || p2.Groups[0].Group != "audit" {
		t.Fatalf("ListGroups page 2: %+v, %v", p2, err)
	}
	if p3, err := c.ListGroups(ctx, admin.ListGroupsParams{Topic: "orders", State: admin.Dead}); err != nil || len(p3.Groups) != 0 {
		t.Fatalf("ListGroups DEAD: %+v, %v", p3, err)
	}
	if gs, err := c.TopicGroups(ctx, "orders"); err != nil || len(gs) != 2 {
		t.Fatalf("TopicGroups: %+v, %v", gs, err)
	}

	publish := func(n int) {
		t.Helper()
		msgs := make([]map[string]string, n)
		for i := range msgs {
			msgs[i] = map[string]string{"payload": "m"}
		}
		if _, err := c.Call(ctx, http.MethodPost, admin.TopicPath("orders", "messages"), nil, map[string]any{"messages": msgs}, nil); err != nil {
			t.Fatal(err)
		}
	}
	publish(2)
	mc, err := c.MessageCompletion(ctx, "orders", "1")
	if err != nil || mc.ID != "1" || mc.Complete || len(mc.Groups) != 2 || mc.Groups[0].Group != "billing" || mc.Groups[0].State != admin.CompletionPending {
		t.Fatalf("MessageCompletion: %+v, %v", mc, err)
	}

	// billing goes DEAD (as its heartbeat timeout would make it), misses 3 messages, and is
	// resurrected with the backfill of what it missed.
	if _, err := b.Engine.SubscriptionUpdate(ctx, &storage.SubscriptionUpdateParams{ID: billing.SubscriptionID, State: storage.Dead}); err != nil {
		t.Fatal(err)
	}
	if g, err := c.Group(ctx, "orders", "billing"); err != nil || g.State != admin.Dead {
		t.Fatalf("Group billing after DEAD: %+v, %v", g, err)
	}
	publish(3)
	g, err := c.ResurrectGroup(ctx, "orders", "billing", true)
	if err != nil || g.State != admin.Active || g.Backfill == nil || g.Backfill.State != admin.BackfillInProgress || g.Backfill.Total != 5 {
		t.Fatalf("ResurrectGroup: %+v (backfill %+v), %v", g, g.Backfill, err)
	}
	_, err = c.ResurrectGroup(ctx, "orders", "billing", false)
	wantAPIError(t, "ResurrectGroup of an ACTIVE group", err, http.StatusConflict, "INVALID_TRANSITION")

	bf, err := c.Backfill(ctx, "orders", "billing")
	if err != nil || bf.State != admin.BackfillInProgress || bf.Total != 5 || bf.Remaining != 5 {
		t.Fatalf("Backfill: %+v, %v", bf, err)
	}
	if bf, err = c.CancelBackfill(ctx, "orders", "billing", false); err != nil || bf.State != admin.BackfillCancelled || bf.Skipped != 0 {
		t.Fatalf("CancelBackfill: %+v, %v", bf, err)
	}
	if bf, err = c.ResumeBackfill(ctx, "orders", "billing"); err != nil || bf.State != admin.BackfillInProgress {
		t.Fatalf("ResumeBackfill: %+v, %v", bf, err)
	}
	if bf, err = c.CancelBackfill(ctx, "orders", "billing", true); err != nil || bf.State != admin.BackfillCancelled || bf.Skipped != 5 || bf.Remaining != 0 {
		t.Fatalf("CancelBackfill skip: %+v, %v", bf, err)
	}

	g, err = c.UpdateGroup(ctx, "orders", "audit", admin.UpdateGroupRequest{HeartbeatTimeout: admin.Duration(20 * time.Second)})
	if err != nil || time.Duration(g.HeartbeatTimeout) != 20*time.Second || g.Start.Kind != admin.FromBeginning {
		t.Fatalf("UpdateGroup: %+v, %v", g, err)
	}
	fc, err := c.ForceComplete(ctx, "orders", "audit", time.Hour, 10)
	if err != nil || fc.Topic != "orders" || fc.Group != "audit" || fc.Completed != 0 || fc.Before.IsZero() {
		t.Fatalf("ForceComplete: %+v, %v", fc, err)
	}
	ft, err := c.ForceCompleteTopic(ctx, "orders", time.Hour, 10)
	if err != nil || ft.Topic != "orders" || len(ft.Groups) == 0 {
		t.Fatalf("ForceCompleteTopic: %+v, %v", ft, err)
	}
	_, err = c.ForceComplete(ctx, "orders", "audit", time.Millisecond, 0)
	wantAPIError(t, "ForceComplete under 1s", err, http.StatusBadRequest, "INVALID_ARGUMENT")

	tl, err := c.Topics(ctx, admin.TopicsParams{Pattern: "orders"})
	if err != nil || tl.Total != 1 || len(tl.Topics) != 1 || tl.Topics[0].Stats == nil || tl.Topics[0].Stats.Messages != 5 || tl.Topics[0].Subscriptions != 2 {
		t.Fatalf("Topics: %+v, %v", tl, err)
	}
	if cl, err := c.Cleanup(ctx); err != nil || !cl.Healthy {
		t.Fatalf("Cleanup: %+v, %v", cl, err)
	}

	if err := c.RemoveGroup(ctx, "orders", "billing"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Group(ctx, "orders", "billing")
	wantAPIError(t, "Group after RemoveGroup", err, http.StatusNotFound, "SUBSCRIPTION_NOT_FOUND")
	_, err = c.Topic(ctx, "missing")
	wantAPIError(t, "Topic of an unknown topic", err, http.StatusNotFound, "TOPIC_NOT_FOUND")
	_, err = c.TopicGroups(ctx, "missing")
	wantAPIError(t, "TopicGroups of an unknown topic", err, http.StatusNotFound, "TOPIC_NOT_FOUND")

	err = c.DeleteTopic(ctx, "orders", false)
	wantAPIError(t, "DeleteTopic with a group", err, http.StatusConflict, "TOPIC_HAS_SUBSCRIPTIONS")
	if err := c.DeleteTopic(ctx, "orders", true); err != nil {
		t.Fatal(err)
	}
}

// TestWithToken: with authentication on, a request without the token is NOT_AUTHENTICATED and
// one with WithToken's is served.
func TestWithToken(t *testing.T) {
	t.Parallel()
	const token = "ops-0123456789abcdef"
	hash, err := auth.HashToken(token)
	if err != nil {
		t.Fatal(err)
	}
	authz, err := auth.New(auth.Config{Principals: []auth.Principal{
		{Name: "ops", TokenHash: hash, Permissions: []auth.Permission{{Action: auth.Admin, Topics: "#"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	b := newBroker(t, authz)
	ctx := testCtx(t)
	anon, err := admin.NewClient(b.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = anon.Cleanup(ctx)
	wantAPIError(t, "without a token", err, http.StatusUnauthorized, "NOT_AUTHENTICATED")
	c, err := admin.NewClient(b.URL, nil, admin.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cleanup(ctx); err != nil {
		t.Fatalf("with the token: %v", err)
	}
}

// TestWithTLSConfig: an https server is reached with the CA given by WithTLSConfig, and not
// without it (an *UnreachableError); the caller's http.Client is left as it was.
func TestWithTLSConfig(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"healthy":true,"jobs":[]}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake refused below
	srv.StartTLS()
	defer srv.Close()
	ctx := testCtx(t)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	hc := &http.Client{Timeout: waitTimeout}
	c, err := admin.NewClient(strings.TrimPrefix(srv.URL, "https://"), hc, admin.WithTLSConfig(&tls.Config{RootCAs: pool}))
	if err != nil || !strings.HasPrefix(c.Base(), "https://") {
		t.Fatalf("NewClient host:port with TLS: %v", err)
	}
	if cl, err := c.Cleanup(ctx); err != nil || !cl.Healthy {
		t.Fatalf("Cleanup over TLS: %+v, %v", cl, err)
	}
	if hc.Transport != nil {
		t.Fatal("NewClient changed the caller's http.Client")
	}
	plain, err := admin.NewClient(srv.URL, hc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = plain.Cleanup(ctx)
	var ue *admin.UnreachableError
	if !errors.As(err, &ue) || ue.Base != srv.URL || !strings.Contains(err.Error(), "cannot reach the admin API at "+srv.URL+": ") {
		t.Fatalf("without the CA: %v", err)
	}
	srv.Client().CloseIdleConnections()
}

// TestClientErrors: bad addresses and options, answers that are not the API's (a proxy's page),
// and an address where nothing listens.
func TestClientErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	for _, addr := range []string{"", "localhost", "ftp://host:21", "http://", "http://host:1/?q=1"} {
		if _, err := admin.NewClient(addr, nil); err == nil || !strings.Contains(err.Error(), "admin API address") {
			t.Errorf("NewClient(%q): %v, want an address error", addr, err)
		}
	}
	if _, err := admin.NewClient("http://host:1", nil, admin.WithTLSConfig(&tls.Config{})); err == nil {
		t.Error("WithTLSConfig with http:// accepted")
	}
	custom := &http.Client{Transport: roundTripper(func(*http.Request) (*http.Response, error) { return nil, errors.New("x") })}
	if _, err := admin.NewClient("https://host:1", custom, admin.WithTLSConfig(&tls.Config{})); err == nil {
		t.Error("WithTLSConfig with a custom Transport accepted")
	}

	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		_, _ = w.Write([]byte("<html>\n  <body>Bad   gateway</body>\n</html>"))
	}))
	defer proxy.Close()
	c, err := admin.NewClient(proxy.URL+"/", nil)
	if err != nil || c.Base() != proxy.URL {
		t.Fatalf("NewClient: %v, base %q", err, c.Base())
	}
	_, err = c.Group(ctx, "t", "g")
	wantAPIError(t, "proxy page", err, http.StatusBadGateway, "HTTP_502")
	if err.Error() != "HTTP_502: Bad Gateway: <html> <body>Bad gateway</body> </html>" {
		t.Errorf("proxy page: %q", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	down, err := admin.NewClient(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.Topics(ctx, admin.TopicsParams{})
	var ue *admin.UnreachableError
	var ae *admin.APIError
	if !errors.As(err, &ue) || ue.Base != "http://"+addr || errors.As(err, &ae) {
		t.Fatalf("unreachable API: %v", err)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestRebalanceGroup: RebalanceGroup reassigns an ordered group on a real broker (a new
// generation, the strategy given) and answers INVALID_ARGUMENT for a shared group.
func TestRebalanceGroup(t *testing.T) {
	t.Parallel()
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c, err := admin.NewClient(b.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTopic(ctx, "accounts", admin.TopicConfig{Semantics: admin.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	ledger, err := c.CreateGroup(ctx, "accounts", admin.CreateGroupRequest{Group: "ledger", Mode: "ordered"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateGroup(ctx, "accounts", admin.CreateGroupRequest{Group: "audit"}); err != nil {
		t.Fatal(err)
	}
	g, err := c.RebalanceGroup(ctx, "accounts", "ledger", admin.RebalanceRequest{Strategy: "sticky"})
	if err != nil || g.Mode != "ordered" || g.Strategy != "sticky" || g.Generation != ledger.Generation+1 {
		t.Fatalf("RebalanceGroup: %+v, %v; want sticky at generation %d", g, err, ledger.Generation+1)
	}
	_, err = c.RebalanceGroup(ctx, "accounts", "audit", admin.RebalanceRequest{})
	wantAPIError(t, "RebalanceGroup of a shared group", err, http.StatusBadRequest, "INVALID_ARGUMENT")
}
