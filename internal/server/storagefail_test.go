package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/storage/pgstore"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/storage/wal/wlog/wlogtest"
	"github.com/spoolmq/spool/internal/testutil"
	"github.com/spoolmq/spool/protocol"
)

// Storage failures (issue 15, "honest errors"): a disk that is full, a process out of file
// handles and a database that stopped answer the storage codes, not INTERNAL, over the binary
// protocol, the text mode and HTTP, for publishes, acks and nacks alike; no message carries a
// file path of the server.

// failEnv is a server with the HTTP API over one engine whose storage a test breaks.
type failEnv struct {
	*env
	http    *httptest.Server
	httpCli *http.Client
	// secret is a string no client-facing message may contain (the data directory).
	secret string
}

func newFailEnv(t *testing.T, eng storage.Engine, secret string) *failEnv {
	e := newEnvEngine(t, eng, nil, nil)
	h, err := admin.New(admin.Config{Broker: e.b, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("admin.New: %v", err)
	}
	srv := httptest.NewServer(h)
	tr := &http.Transport{}
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = h.Close(ctx)
	})
	return &failEnv{env: e, http: srv, httpCli: &http.Client{Transport: tr, Timeout: waitTimeout}, secret: secret}
}

// noSecret fails when a client-facing message carries the server's paths.
func (f *failEnv) noSecret(what, msg string) {
	f.t.Helper()
	if f.secret != "" && strings.Contains(msg, f.secret) || strings.Contains(msg, ".seg") {
		f.t.Errorf("%s: message %q carries a server path", what, msg)
	}
}

// expectBinary checks an Error frame: code, retry flag, no path.
func (f *failEnv) expectBinary(c *bclient, what string, m protocol.Message, code uint16) *protocol.Error {
	f.t.Helper()
	e := c.expectErr(m, code)
	if !e.Retryable {
		f.t.Errorf("%s: %v not retryable", what, e)
	}
	if !client.IsRetryable(e) {
		f.t.Errorf("%s: client.IsRetryable(%v) = false", what, e)
	}
	f.noSecret(what, e.Message)
	return e
}

// expectText publishes over the text mode and checks the ERR line.
func (f *failEnv) expectText(topic string, name string) {
	f.t.Helper()
	tc := f.dialText()
	tc.send("PUBLISH " + topic + " over-text")
	l := tc.expect("ERR " + name + " ")
	f.noSecret("text PUBLISH", l)
}

// expectHTTP publishes over HTTP and checks the status and the JSON error.
func (f *failEnv) expectHTTP(topic string, status int, name string) {
	f.t.Helper()
	resp, err := f.httpCli.Post(f.http.URL+"/api/v1/topics/"+topic+"/messages", "application/octet-stream", strings.NewReader("over-http"))
	if err != nil {
		f.t.Fatalf("HTTP publish: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != status || got.Error.Code != name || !got.Error.Retryable {
		f.t.Errorf("HTTP publish: %d %s, want %d %s retryable", resp.StatusCode, body, status, name)
	}
	f.noSecret("HTTP publish", got.Error.Message)
}

// holdTwo publishes two messages to topic (a QUEUE) and returns a client holding both.
func (f *failEnv) holdTwo(topic string) (*bclient, []protocol.Delivery) {
	c := f.dial(nil)
	return c, c.holdN(topic, 2)
}

// TestStorageFullWAL: the disk fills up under the embedded engine. The publish whose write fails
// may or may not be on disk (INTERNAL, saying so); from then on the engine refuses changes, and
// publishes, acks and nacks answer STORAGE_FULL (nothing stored) until the broker restarts.
func TestStorageFullWAL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	efs := wlogtest.NewErrorFS(nil, nil)
	eng, err := wal.Open(dir, wal.Config{FS: efs})
	if err != nil {
		t.Fatal(err)
	}
	f := newFailEnv(t, eng, dir)
	c, ds := f.holdTwo("t")

	topics := string(filepath.Separator) + "topics" + string(filepath.Separator)
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpWrite && strings.Contains(path, topics) {
			return &fs.PathError{Op: "write", Path: path, Err: syscall.ENOSPC}
		}
		return nil
	})
	one := []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("x")}}
	first := f.expectBinary(c, "publish that hits the full disk", &protocol.Publish{Topic: "t", Messages: one}, protocol.CodeInternal)
	if !strings.Contains(first.Message, "may or may not") || !strings.Contains(first.Message, "no space left on device") {
		t.Errorf("first failed publish: %q does not say the outcome is unknown and why", first.Message)
	}
	full := f.expectBinary(c, "publish", &protocol.Publish{Topic: "t", Messages: one}, protocol.CodeStorageFull)
	if !strings.Contains(full.Message, "no space left on device") {
		t.Errorf("STORAGE_FULL message %q does not say why", full.Message)
	}
	f.expectBinary(c, "ack", &protocol.Ack{Refs: refs(ds[0])}, protocol.CodeStorageFull)
	f.expectBinary(c, "nack", &protocol.Nack{Refs: refs(ds[1])}, protocol.CodeStorageFull)
	f.expectText("t", "STORAGE_FULL")
	f.expectHTTP("t", http.StatusInsufficientStorage, "STORAGE_FULL")
}

// TestOutOfFileHandlesWAL: creating a topic's files fails with EMFILE: the publish that would
// auto-create it answers STORAGE_UNAVAILABLE, nothing is created, and the same publish succeeds
// once files can be opened again.
func TestOutOfFileHandlesWAL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	efs := wlogtest.NewErrorFS(nil, nil)
	eng, err := wal.Open(dir, wal.Config{FS: efs})
	if err != nil {
		t.Fatal(err)
	}
	f := newFailEnv(t, eng, dir)
	c := f.dial(nil)
	efs.SetInjector(func(op wlogtest.Op, path string) error {
		if op == wlogtest.OpOpen {
			return syscall.EMFILE
		}
		return nil
	})
	one := []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("x")}}
	e := f.expectBinary(c, "publish to a new topic", &protocol.Publish{Topic: "new", Messages: one}, protocol.CodeStorageUnavailable)
	if !strings.Contains(e.Message, "too many open files") {
		t.Errorf("STORAGE_UNAVAILABLE message %q does not say why", e.Message)
	}
	f.expectText("new", "STORAGE_UNAVAILABLE")
	f.expectHTTP("new", http.StatusServiceUnavailable, "STORAGE_UNAVAILABLE")
	if _, err := eng.TopicGet(context.Background(), "new"); !errors.Is(err, storage.ErrTopicNotFound) {
		t.Fatalf("topic after the failed creations: %v, want not found", err)
	}
	efs.SetInjector(nil)
	c.publish("new", "x")
}

// TestDatabaseStoppedPG: the PostgreSQL engine's database stops. Publishes, acks and nacks answer
// STORAGE_UNAVAILABLE (the transaction never committed), over every interface; once the database
// is back, the same publish succeeds.
func TestDatabaseStoppedPG(t *testing.T) {
	t.Parallel()
	cluster := testutil.StartPGCluster(t)
	eng, err := pgstore.Open(context.Background(), pgstore.Config{URL: cluster.URL, Migrate: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	f := newFailEnv(t, eng, "")
	c, ds := f.holdTwo("t")
	cluster.Stop("fast")

	one := []protocol.PublishMessage{{Partition: protocol.PartitionAuto, Payload: []byte("x")}}
	f.expectBinary(c, "publish", &protocol.Publish{Topic: "t", Messages: one}, protocol.CodeStorageUnavailable)
	f.expectBinary(c, "ack", &protocol.Ack{Refs: refs(ds[0])}, protocol.CodeStorageUnavailable)
	f.expectBinary(c, "nack", &protocol.Nack{Refs: refs(ds[1])}, protocol.CodeStorageUnavailable)
	f.expectText("t", "STORAGE_UNAVAILABLE")
	f.expectHTTP("t", http.StatusServiceUnavailable, "STORAGE_UNAVAILABLE")

	cluster.Start()
	eventually(t, "publish after the database restarted", func() error {
		_, err := eng.MessagesAppend(context.Background(), &storage.MessagesAppendParams{Topic: "t",
			Messages: []storage.AppendMessage{{Partition: storage.PartitionAuto}}})
		return err
	})
	c.publish("t", "x")
}
