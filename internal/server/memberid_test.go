package server

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// TestAuthMemberIDsPerPrincipal: bob (binary) and carol (text) both choose the member id w in one
// ordered group. Both join and see w; the broker knows them as w@bob and w@carol, and gives each
// a partition of its own, so neither can take the other's partitions or push it out. bob
// choosing w again while his w is live is refused as before.
func TestAuthMemberIDsPerPrincipal(t *testing.T) {
	t.Parallel()
	e, _ := authEnv(t)
	ctx := context.Background()
	if _, err := e.b.CreateTopic(ctx, "orders.o", storage.TopicConfig{Semantics: storage.PubSub, Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	bob := e.dial(&protocol.Hello{ClientName: "bob", Token: bobToken})
	ok := bob.subscribe(&protocol.Subscribe{Topic: "orders.o", Group: "g", MemberID: "w", Mode: protocol.GroupOrdered, MaxInFlight: 10,
		Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}})
	if ok.MemberID != "w" {
		t.Fatalf("bob's SubscribeOK member id %q, want w", ok.MemberID)
	}
	carol := e.dialText()
	carol.send("AUTH "+carolToken, "JOIN_GROUP g w ORDERED", "SUBSCRIBE orders.o FROM_BEGINNING")
	carol.expect("OK authenticated as carol")
	carol.expect("OK group g consumer w ordered")
	carol.expectLine("OK subscribed orders.o group g consumer w")
	bob.expectErr(&protocol.Subscribe{Topic: "orders.o", Group: "g", MemberID: "w", Mode: protocol.GroupOrdered}, protocol.CodeInvalidArgument)

	var owner [2]string
	eventually(t, "w@bob and w@carol own a partition each", func() error {
		a, err := e.b.GroupAssignment(ctx, "orders.o", "g")
		if err != nil {
			return err
		}
		if len(a.Members) != 2 || len(a.Members["w@bob"]) != 1 || len(a.Members["w@carol"]) != 1 {
			return fmt.Errorf("assignment %v", a.Members)
		}
		owner[0], owner[1] = a.Owner(0), a.Owner(1)
		return nil
	})
	var ids []string
	for _, m := range e.b.Members() {
		ids = append(ids, m.ID)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"w@bob", "w@carol"}) {
		t.Fatalf("members %q, want w@bob, w@carol", ids)
	}
	for p := range int32(2) {
		if _, err := e.b.Publish(ctx, "orders.o", []storage.AppendMessage{{Partition: p, Payload: fmt.Appendf(nil, "p%d", p)}}); err != nil {
			t.Fatal(err)
		}
	}
	bobGot := fmt.Sprintf("p%d", slices.Index(owner[:], "w@bob"))
	carolGot := fmt.Sprintf("p%d", slices.Index(owner[:], "w@carol"))
	if got := payloadsOf(bob.deliveriesN(1)); !slices.Equal(got, []string{bobGot}) {
		t.Errorf("bob got %q, want %s", got, bobGot)
	}
	carol.expectLine("MESSAGE orders.o " + carolGot)
}
