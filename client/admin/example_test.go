package admin_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spoolmq/spool/client/admin"
)

// A group created ahead of its consumers, read back, and the typed error of an unknown topic.
func ExampleClient() {
	base, stop := exampleBroker() // a real broker with its admin API (helpers_test.go)
	defer stop()
	ctx := context.Background()

	c, err := admin.NewClient(base, nil) // add admin.WithToken(token) when auth is on
	if err != nil {
		panic(err)
	}
	if _, err := c.CreateTopic(ctx, "orders.created", admin.TopicConfig{Semantics: admin.PubSub}); err != nil {
		panic(err)
	}
	g, err := c.CreateGroup(ctx, "orders.created", admin.CreateGroupRequest{
		Group:               "audit",
		Start:               admin.StartPosition{Kind: admin.FromBeginning},
		HeartbeatTimeout:    admin.Duration(10 * time.Minute),
		MaxBackfillMessages: 100_000,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(g.Group, g.State, g.Start.Kind, time.Duration(g.HeartbeatTimeout))

	_, err = c.Topic(ctx, "orders.deleted")
	var ae *admin.APIError
	if errors.As(err, &ae) {
		fmt.Println(ae.Status, ae.Code)
	}
	// Output:
	// audit ACTIVE FROM_BEGINNING 10m0s
	// 404 TOPIC_NOT_FOUND
}
