package protocol_test

import (
	"fmt"
	"net"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// A toy server answering one client over a real connection pair: the handshake, a publish, a
// subscription with one delivery, its ack, and a clean goodbye (docs/protocol.md section 5).
func Example_session() {
	clientConn, serverConn := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- toyServer(serverConn) }()
	defer func() { _ = clientConn.Close(); <-done }()

	r := protocol.NewReader(clientConn, 0)
	w := protocol.NewWriter(clientConn, 0)
	call := func(corr uint32, m protocol.ClientMessage) protocol.ServerMessage {
		if err := w.WriteMessage(corr, m); err != nil {
			panic(err)
		}
		if err := w.Flush(); err != nil {
			panic(err)
		}
		for {
			gotCorr, resp, err := r.ReadServerMessage()
			if err != nil {
				panic(err)
			}
			if d, ok := resp.(*protocol.Deliver); ok {
				for _, dl := range d.Deliveries {
					fmt.Printf("deliver %s %s attempt %d\n", dl.Topic, dl.Payload, dl.Attempt)
				}
				continue
			}
			if gotCorr != corr {
				panic("correlation id mismatch")
			}
			return resp
		}
	}

	// Handshake: preamble and Hello out, the server's preamble and HelloOK back.
	ok, err := protocol.ClientHandshake(r, w, &protocol.Hello{ClientName: "example"})
	if err != nil {
		panic(err)
	}
	fmt.Println("version", ok.Version, "heartbeat", ok.HeartbeatInterval)

	pub := call(2, &protocol.Publish{Topic: "orders.created", Messages: []protocol.PublishMessage{
		{Partition: protocol.PartitionAuto, Payload: []byte("hello-world")},
	}}).(*protocol.PublishOK)
	fmt.Println("published at offset", pub.Positions[0].Offset)

	sub := call(3, &protocol.Subscribe{Topic: "orders.created", MaxInFlight: 10, Start: protocol.StartPosition{Kind: protocol.StartFromBeginning}}).(*protocol.SubscribeOK)
	fmt.Println("handle", sub.Handle, "subscriptions", len(sub.Subscriptions))

	ack := call(4, &protocol.Ack{Refs: []protocol.Ref{{SubscriptionID: sub.Subscriptions[0].SubscriptionID, Offset: 0}}}).(*protocol.AckOK)
	fmt.Println("acked", ack.Acked)

	bad := call(5, &protocol.Publish{Topic: "no.such.topic"}).(*protocol.Error)
	fmt.Println("error:", bad, "retryable:", protocol.IsRetryable(bad))

	call(6, &protocol.Goodbye{})
	fmt.Println("goodbye")
	// Output:
	// version 6 heartbeat 10s
	// published at offset 0
	// handle 1 subscriptions 1
	// deliver orders.created hello-world attempt 1
	// acked 1
	// error: TOPIC_NOT_FOUND: topic "no.such.topic" does not exist retryable: false
	// goodbye
}

// toyServer plays the server side of Example_session. A real server dispatches to the broker.
func toyServer(conn net.Conn) error {
	defer conn.Close()
	r := protocol.NewReader(conn, 0)
	w := protocol.NewWriter(conn, 0)
	if err := r.ReadPreamble(); err != nil {
		return err
	}
	_ = w.WritePreamble()
	var stored []byte
	for {
		corr, m, err := r.ReadClientMessage()
		if err != nil {
			return err
		}
		var resp protocol.ServerMessage
		switch m := m.(type) {
		case *protocol.Hello:
			v, err := protocol.NegotiateVersion(m.MinVersion, m.MaxVersion)
			if err != nil {
				resp = protocol.AsError(err)
				break
			}
			resp = &protocol.HelloOK{Version: v, ServerName: "toy", SessionID: "s1",
				HeartbeatInterval: 10 * time.Second, SessionTimeout: 30 * time.Second,
				MaxFrameSize: protocol.DefaultMaxFrameSize, MaxMessageSize: protocol.DefaultMaxMessageSize}
		case *protocol.Publish:
			if m.Topic != "orders.created" {
				resp = protocol.ErrTopicNotFound.Errorf("topic %q does not exist", m.Topic)
				break
			}
			stored = m.Messages[0].Payload
			resp = &protocol.PublishOK{Positions: []protocol.Position{{Offset: 0, PublishTime: time.Unix(1, 0)}}}
		case *protocol.Subscribe:
			if err := w.WriteMessage(corr, &protocol.SubscribeOK{Handle: 1, MemberID: "m1",
				Subscriptions: []protocol.SubscriptionInfo{{SubscriptionID: 7, Topic: m.Topic}}}); err != nil {
				return err
			}
			// Pushes carry correlation id 0.
			resp, corr = &protocol.Deliver{Deliveries: []protocol.Delivery{{Handle: 1, SubscriptionID: 7,
				Topic: m.Topic, Attempt: 1, LeaseDeadline: time.Unix(31, 0), PublishTime: time.Unix(1, 0), Payload: stored}}}, 0
		case *protocol.Ack:
			resp = &protocol.AckOK{Acked: uint32(len(m.Refs))}
		case *protocol.Goodbye:
			if err := w.WriteMessage(corr, &protocol.GoodbyeOK{}); err != nil {
				return err
			}
			return w.Flush()
		default:
			resp = protocol.ErrUnexpectedFrame.Errorf("%s", m.Opcode())
		}
		if err := w.WriteMessage(corr, resp); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
}
