package client

import "time"

// ConnectHook is called after every successful handshake, including reconnects.
type ConnectHook interface {
	OnConnect(ConnectEvent)
}

// DisconnectHook is called when a connection ends, for any reason (broken, closed by the broker,
// closed by Close).
type DisconnectHook interface {
	OnDisconnect(DisconnectEvent)
}

// PublishHook is called when a Publish request completes (one call per request: a PublishBatch,
// a sync Publish, or a batch of coalesced PublishAsync messages), also when it failed.
type PublishHook interface {
	OnPublish(PublishEvent)
}

// HandleHook is called after a subscription handler returned and the delivery was settled (or,
// with ManualAck, left to the application).
type HandleHook interface {
	OnHandle(HandleEvent)
}

// SubscriptionEndedHook is called when the broker ends a subscription or a whole handle
// (SubscriptionEnded push), for example when an administrator cancelled the group.
type SubscriptionEndedHook interface {
	OnSubscriptionEnded(SubscriptionEndedEvent)
}

// ConnectEvent describes a new session.
type ConnectEvent struct {
	// Addr is the address dialled.
	Addr string
	// ServerName and SessionID are the broker's names for the instance and the session.
	ServerName string
	SessionID  string
	// Version is the negotiated protocol version.
	Version uint16
	// Reconnect is false for the first connection of the Client, true afterwards.
	Reconnect bool
}

// DisconnectEvent describes the end of a session.
type DisconnectEvent struct {
	Addr      string
	SessionID string
	// Err is why the connection ended (wrapping ErrConnectionLost, or ErrClientClosed for Close).
	Err error
}

// PublishEvent describes one completed Publish request.
type PublishEvent struct {
	Topic string
	// Messages and Bytes count the messages and their payload bytes in the request.
	Messages int
	Bytes    int
	// Took is the time from sending the request to its answer.
	Took time.Duration
	// Err is nil on success.
	Err error
}

// HandleEvent describes one handled delivery.
type HandleEvent struct {
	Topic   string
	Group   string
	Attempt int
	// Took is the handler's run time.
	Took time.Duration
	// Err is the handler's error (nil: acked unless ManualAck).
	Err error
	// SettleErr is the error of the automatic ack or nack, if it failed to be sent.
	SettleErr error
}

// SubscriptionEndedEvent describes a SubscriptionEnded push.
type SubscriptionEndedEvent struct {
	// Topic is the subscription's topic. When the whole handle closed it is empty, or the topic,
	// created after the Subscribe, whose subscription the handle could not join (Err says why:
	// LIMIT_EXCEEDED, SUBSCRIPTION_EXISTS for a mode conflict...; docs/protocol.md section 8.5).
	Topic string
	// Pattern and Group are the parameters of the Subscription it belonged to.
	Pattern string
	Group   string
	// HandleClosed reports that the whole handle closed, not one topic's subscription.
	HandleClosed bool
	// Err is the broker's reason (*protocol.Error).
	Err error
}

func isHook(h any) bool {
	switch h.(type) {
	case ConnectHook, DisconnectHook, PublishHook, HandleHook, SubscriptionEndedHook:
		return true
	}
	return false
}

// hookSet holds the hooks sorted by interface, so that calling them costs nothing when there are
// none.
type hookSet struct {
	connect    []ConnectHook
	disconnect []DisconnectHook
	publish    []PublishHook
	handle     []HandleHook
	ended      []SubscriptionEndedHook
}

func newHookSet(hooks []any) hookSet {
	var s hookSet
	for _, h := range hooks {
		if x, ok := h.(ConnectHook); ok {
			s.connect = append(s.connect, x)
		}
		if x, ok := h.(DisconnectHook); ok {
			s.disconnect = append(s.disconnect, x)
		}
		if x, ok := h.(PublishHook); ok {
			s.publish = append(s.publish, x)
		}
		if x, ok := h.(HandleHook); ok {
			s.handle = append(s.handle, x)
		}
		if x, ok := h.(SubscriptionEndedHook); ok {
			s.ended = append(s.ended, x)
		}
	}
	return s
}
