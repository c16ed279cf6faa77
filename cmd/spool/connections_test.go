package main

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/protocol"
)

// TestAdminConnectionsProtocolVersion: GET /admin/connections shows the protocol version each
// binary connection negotiated (an older client's own version, not the server's newest), and 0
// for a text connection.
func TestAdminConnectionsProtocolVersion(t *testing.T) {
	s := startCLIStack(t)
	dial := func(hello *protocol.Hello) {
		t.Helper()
		nc, err := net.DialTimeout("tcp", s.addr, cliWaitTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(cliWaitTimeout))
		if _, err := protocol.ClientHandshake(protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0), hello); err != nil {
			t.Fatalf("handshake of %s: %v", hello.ClientName, err)
		}
	}
	dial(&protocol.Hello{ClientName: "old", MinVersion: protocol.Version2, MaxVersion: protocol.Version3})
	dial(&protocol.Hello{ClientName: "new"})
	nc, err := net.DialTimeout("tcp", s.addr, cliWaitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(cliWaitTimeout))
	if _, err := nc.Write([]byte("PING\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Read(make([]byte, 64)); err != nil { // the answer: the server knows the mode
		t.Fatal(err)
	}

	res, err := http.Get(s.httpURL + "/admin/connections")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out admin.SeedConnections
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, c := range out.Connections {
		got[c.Mode+"/"+c.Client] = c.ProtocolVersion
	}
	want := map[string]int{"binary/old": int(protocol.Version3), "binary/new": int(protocol.MaxVersion), "text/": 0}
	if len(got) != len(want) {
		t.Fatalf("connections %+v, want %v", out.Connections, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("connection %s: protocol_version %d (listed %t), want %d (all: %+v)", k, g, ok, v, out.Connections)
		}
	}
}
