package server

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/internal/tlsconf"
	"github.com/spoolmq/spool/protocol"
	"github.com/spoolmq/spool/protocol/text"
)

// Defaults of Config (docs/protocol.md sections 5, 10 and 11; BRIEF.md section 5).
const (
	// DefaultMaxConnections bounds the open connections; beyond it a new connection is answered
	// OVERLOADED and closed.
	DefaultMaxConnections = 10_000
	// DefaultHandshakeTimeout bounds the time from accept to HelloOK (binary), or to the first
	// complete line and, with authentication on, to a successful AUTH (text).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultHeartbeatInterval is the member heartbeat of BRIEF.md section 5.
	DefaultHeartbeatInterval = 10 * time.Second
	// DefaultSessionTimeout is the member session timeout of BRIEF.md section 5.
	DefaultSessionTimeout = 30 * time.Second
	// DefaultMinHeartbeatInterval and DefaultMaxHeartbeatInterval clamp the interval a client asks
	// for in Hello.
	DefaultMinHeartbeatInterval = time.Second
	DefaultMaxHeartbeatInterval = time.Minute
	// DefaultGoodbyeGrace is how long a server that said Goodbye keeps a binary connection open for
	// the client's last acks.
	DefaultGoodbyeGrace = 5 * time.Second
	// DefaultMaxQueuedResponses bounds the responses waiting for the writer of one connection; a
	// reader that finds the queue full stops reading (TCP backpressure) until the writer catches up.
	DefaultMaxQueuedResponses = 1024
	// DefaultMaxSubscriptionsPerConn bounds the subscriptions open on one connection.
	DefaultMaxSubscriptionsPerConn = 1024
	// DefaultMaxPipelinedBytes bounds the Publish frames of one connection read but not yet
	// appended; beyond it the reader stops reading until the publish stage catches up.
	DefaultMaxPipelinedBytes = 32 << 20
	// DefaultTextAckWait is the lease of text-mode deliveries: they stay with the session until it
	// acks, nacks, unsubscribes or ends (docs/protocol.md section 11.4).
	DefaultTextAckWait = 24 * time.Hour
	// DefaultTextMaxInFlight is the credit of each SUBSCRIBE of a text session.
	DefaultTextMaxInFlight = 1000
	// DefaultTextPublisherIdle closes a text session that has only published after that long
	// without input, so that `echo "PUBLISH ..." | nc` ends with every nc (docs/protocol.md 11.5).
	DefaultTextPublisherIdle = time.Second
	// DefaultMaxConnBufferBytes bounds the deliveries queued for one connection and not yet
	// written to its socket (window.go).
	DefaultMaxConnBufferBytes = 8 << 20
	// DefaultTextAckTimeout ends a text session that holds deliveries and has acked or nacked
	// none of them for that long (RabbitMQ's consumer_timeout): its leases go back to the group.
	DefaultTextAckTimeout = 5 * time.Minute
)

// Config configures a Server. The zero value of every field means its default; New applies the
// defaults and validates. The yaml tags are the keys of the "server" section of the spool
// configuration file (package config).
type Config struct {
	// Name identifies this broker instance in HelloOK. Defaults to the host name.
	Name string `yaml:"name"`
	// MaxConnections bounds the open connections, both modes. Defaults to 10,000.
	MaxConnections int `yaml:"max_connections"`
	// MaxFrameSize is the largest binary frame, header included, in both directions; announced in
	// HelloOK. Defaults to 10 MiB; between 64 KiB and 1 GiB.
	MaxFrameSize int `yaml:"max_frame_size"`
	// MaxLineLength is the longest text-mode line without its terminator. Defaults to 1 MiB + 1 KiB
	// (text.DefaultMaxLineLength).
	MaxLineLength int `yaml:"max_line_length"`
	// HandshakeTimeout bounds the time from accept to the first byte; for binary connections to
	// HelloOK, for text sessions to their first complete line and, with authentication on, to a
	// successful AUTH (docs/protocol.md 11.2, 11.5). Defaults to 10 s.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// HeartbeatInterval is the heartbeat of a binary session whose Hello asks for 0. Defaults to
	// 10 s.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// SessionTimeout is the silence after which a binary session with the default heartbeat is
	// closed and its members leave (their leases are released). A session with another heartbeat
	// interval gets the same ratio (3 intervals by default). Defaults to 30 s; at least twice
	// HeartbeatInterval. It also bounds a stalled write (a client that does not read). On
	// PostgreSQL it is also the member timeout of ordered groups (within 100 ms to 24 h): the
	// members of a broker instance that stopped renewing them (crashed) leave their groups'
	// assignments that long after its last renewal.
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// MinHeartbeatInterval and MaxHeartbeatInterval clamp the interval a client asks for.
	// Default to 1 s and 60 s.
	MinHeartbeatInterval time.Duration `yaml:"min_heartbeat_interval"`
	MaxHeartbeatInterval time.Duration `yaml:"max_heartbeat_interval"`
	// GoodbyeGrace is how long Stop lets binary clients settle their deliveries after the server's
	// Goodbye before it closes their connections. Defaults to 5 s; must be positive.
	GoodbyeGrace time.Duration `yaml:"goodbye_grace"`
	// MaxCredit bounds a handle's credit (Subscribe.max_in_flight plus Credit); it is announced in
	// HelloOK.properties["server.max_credit"]. Defaults to 65,536
	// (broker.MaxInFlightLimit), which is also its maximum.
	MaxCredit int `yaml:"max_credit"`
	// MaxSubscriptionsPerConn bounds the subscriptions (handles) open on one connection, binary or
	// text: each holds a broker member, its credit's buffer and, without a group on a PUB_SUB
	// topic, an ephemeral subscription. A Subscribe past it gets LIMIT_EXCEEDED. Defaults to 1024.
	MaxSubscriptionsPerConn int `yaml:"max_subscriptions_per_connection"`
	// MaxQueuedResponses bounds the requests of one connection in progress: responses queued for
	// its writer plus publishes queued for its publish stage or being appended. Beyond it the
	// connection's reader stops reading (TCP backpressure). Defaults to 1024.
	MaxQueuedResponses int `yaml:"max_queued_responses"`
	// MaxPipelinedBytes bounds the frame bodies of the publishes of one connection queued for its
	// publish stage or being appended (a single larger Publish is still accepted when nothing is
	// queued). Beyond it the reader stops reading. Defaults to 32 MiB; at least 64 KiB.
	MaxPipelinedBytes int `yaml:"max_pipelined_bytes"`
	// MaxConnBufferBytes bounds the bytes of deliveries queued for one connection and not yet
	// written to its socket: a consumer that does not read stops receiving (its credit is not
	// used) until what is queued drains (window.go). Defaults to 8 MiB; between 64 KiB and 1 GiB.
	MaxConnBufferBytes int `yaml:"max_conn_buffer_bytes"`
	// TextAckTimeout ends a text session that holds deliveries and has not acked or nacked any
	// for that long: its deliveries go back to the group at once. Defaults to 5 min (at most
	// text_ack_wait); at most text_ack_wait.
	TextAckTimeout time.Duration `yaml:"text_ack_timeout"`
	// TextAckWait is the lease of text-mode deliveries. Defaults to 24 h; at most
	// broker.MaxLeaseDuration.
	TextAckWait time.Duration `yaml:"text_ack_wait"`
	// TextMaxInFlight is the credit of each SUBSCRIBE of a text session. Defaults to 1000.
	TextMaxInFlight int `yaml:"text_max_in_flight"`
	// TextPublisherIdle closes a text session that sent nothing but PUBLISH and AUTH after that
	// long without input. Defaults to 1 s.
	TextPublisherIdle time.Duration `yaml:"text_publisher_idle"`
	// TLS names the certificate, key and optional client CA of both listeners (TCP and HTTP);
	// spool serve loads them into TLSConfig and the HTTP server's. The server itself reads
	// TLSConfig only.
	TLS tlsconf.Files `yaml:"tls"`

	// MaxMessageSize is announced in HelloOK as the server's default max message size (each topic
	// enforces its own max_message_bytes). Defaults to 1 MiB.
	MaxMessageSize int `yaml:"-"`
	// Version is announced in HelloOK.properties["server.version"]. Defaults to "dev".
	Version string `yaml:"-"`
	// Logger receives the server's logs. Nil discards them.
	Logger *slog.Logger `yaml:"-"`
	// Metrics receives the server's hook metrics: connections, publishes, deliveries, acks and
	// nacks. Nil records nothing.
	Metrics *metrics.Metrics `yaml:"-"`
	// TLSConfig, when set, wraps every accepted connection in TLS before its first bytes tell the
	// binary protocol from the text mode (the handshake is bounded by HandshakeTimeout).
	TLSConfig *tls.Config `yaml:"-"`
	// Auth authenticates and authorizes clients (binary Hello token, text AUTH, or a client
	// certificate's common name). Nil: authentication is off and every client may do everything.
	Auth *auth.Authorizer `yaml:"-"`
	// Clock is the broker's clock, used for TTLs, heartbeat times and text_ack_timeout. Defaults
	// to storage.SystemClock. (Connection timeouts use the network poller's real time.)
	Clock storage.Clock `yaml:"-"`
}

// DefaultConfig returns the defaults of every field (Name is left empty: it defaults to the host
// name when the server is created).
func DefaultConfig() Config {
	return Config{
		MaxConnections:          DefaultMaxConnections,
		MaxFrameSize:            protocol.DefaultMaxFrameSize,
		MaxLineLength:           text.DefaultMaxLineLength,
		HandshakeTimeout:        DefaultHandshakeTimeout,
		HeartbeatInterval:       DefaultHeartbeatInterval,
		SessionTimeout:          DefaultSessionTimeout,
		MinHeartbeatInterval:    DefaultMinHeartbeatInterval,
		MaxHeartbeatInterval:    DefaultMaxHeartbeatInterval,
		GoodbyeGrace:            DefaultGoodbyeGrace,
		MaxCredit:               broker.MaxInFlightLimit,
		MaxSubscriptionsPerConn: DefaultMaxSubscriptionsPerConn,
		MaxQueuedResponses:      DefaultMaxQueuedResponses,
		MaxPipelinedBytes:       DefaultMaxPipelinedBytes,
		TextAckWait:             DefaultTextAckWait,
		TextMaxInFlight:         DefaultTextMaxInFlight,
		TextPublisherIdle:       DefaultTextPublisherIdle,
		MaxConnBufferBytes:      DefaultMaxConnBufferBytes,
		TextAckTimeout:          DefaultTextAckTimeout,
		MaxMessageSize:          storage.DefaultMaxMessageBytes,
		Version:                 "dev",
	}
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.Name == "" {
		c.Name = "spool"
		if h, err := os.Hostname(); err == nil && h != "" {
			c.Name = h
		}
	}
	c.MaxConnections = cmp.Or(c.MaxConnections, d.MaxConnections)
	c.MaxFrameSize = cmp.Or(c.MaxFrameSize, d.MaxFrameSize)
	c.MaxLineLength = cmp.Or(c.MaxLineLength, d.MaxLineLength)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, d.HandshakeTimeout)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, d.HeartbeatInterval)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, d.SessionTimeout)
	c.MinHeartbeatInterval = cmp.Or(c.MinHeartbeatInterval, d.MinHeartbeatInterval)
	c.MaxHeartbeatInterval = cmp.Or(c.MaxHeartbeatInterval, d.MaxHeartbeatInterval)
	c.GoodbyeGrace = cmp.Or(c.GoodbyeGrace, d.GoodbyeGrace)
	c.MaxCredit = cmp.Or(c.MaxCredit, d.MaxCredit)
	c.MaxSubscriptionsPerConn = cmp.Or(c.MaxSubscriptionsPerConn, d.MaxSubscriptionsPerConn)
	c.MaxQueuedResponses = cmp.Or(c.MaxQueuedResponses, d.MaxQueuedResponses)
	c.MaxPipelinedBytes = cmp.Or(c.MaxPipelinedBytes, d.MaxPipelinedBytes)
	c.TextAckWait = cmp.Or(c.TextAckWait, d.TextAckWait)
	c.TextMaxInFlight = cmp.Or(c.TextMaxInFlight, d.TextMaxInFlight)
	c.TextPublisherIdle = cmp.Or(c.TextPublisherIdle, d.TextPublisherIdle)
	c.MaxConnBufferBytes = cmp.Or(c.MaxConnBufferBytes, d.MaxConnBufferBytes)
	if c.TextAckTimeout == 0 {
		c.TextAckTimeout = min(d.TextAckTimeout, c.TextAckWait)
	}
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, d.MaxMessageSize)
	c.Version = cmp.Or(c.Version, d.Version)
	if c.Clock == nil {
		c.Clock = storage.SystemClock{}
	}
	return c
}

// Validate reports the first invalid field of a config that WithDefaults was applied to, named by
// its yaml key. The error wraps storage.ErrInvalidArgument.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s %s", storage.ErrInvalidArgument, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.MaxConnections < 1 || c.MaxConnections > 1_000_000:
		return bad("max_connections", "must be between 1 and 1000000, got %d", c.MaxConnections)
	case c.MaxFrameSize < protocol.MinMaxFrameSize || c.MaxFrameSize > protocol.MaxMaxFrameSize:
		return bad("max_frame_size", "must be between %d and %d, got %d", protocol.MinMaxFrameSize, protocol.MaxMaxFrameSize, c.MaxFrameSize)
	case c.MaxLineLength < 1024 || c.MaxLineLength > protocol.MaxMaxFrameSize:
		return bad("max_line_length", "must be between 1024 and %d, got %d", protocol.MaxMaxFrameSize, c.MaxLineLength)
	case c.HandshakeTimeout < time.Millisecond:
		return bad("handshake_timeout", "must be at least 1ms, got %s", c.HandshakeTimeout)
	case c.MinHeartbeatInterval < time.Millisecond:
		return bad("min_heartbeat_interval", "must be at least 1ms, got %s", c.MinHeartbeatInterval)
	case c.MaxHeartbeatInterval < c.MinHeartbeatInterval || c.MaxHeartbeatInterval > protocol.MaxDuration:
		return bad("max_heartbeat_interval", "must be between min_heartbeat_interval (%s) and %s, got %s", c.MinHeartbeatInterval, protocol.MaxDuration, c.MaxHeartbeatInterval)
	case c.HeartbeatInterval < c.MinHeartbeatInterval || c.HeartbeatInterval > c.MaxHeartbeatInterval:
		return bad("heartbeat_interval", "must be between min_heartbeat_interval (%s) and max_heartbeat_interval (%s), got %s", c.MinHeartbeatInterval, c.MaxHeartbeatInterval, c.HeartbeatInterval)
	case c.SessionTimeout < 2*c.HeartbeatInterval:
		return bad("session_timeout", "must be at least twice heartbeat_interval (%s), got %s", c.HeartbeatInterval, c.SessionTimeout)
	case time.Duration(float64(c.MaxHeartbeatInterval)*c.sessionRatio()) > protocol.MaxDuration:
		return bad("session_timeout", "(%s) scaled to max_heartbeat_interval exceeds %s", c.SessionTimeout, protocol.MaxDuration)
	case c.GoodbyeGrace <= 0:
		// WithDefaults makes 0 the default: refusing it here keeps a configured 0 from becoming 5 s.
		return bad("goodbye_grace", "must be positive (1ms for next to none), got %s", c.GoodbyeGrace)
	case c.MaxCredit < 1 || c.MaxCredit > broker.MaxInFlightLimit:
		return bad("max_credit", "must be between 1 and %d, got %d", broker.MaxInFlightLimit, c.MaxCredit)
	case c.MaxSubscriptionsPerConn < 1 || c.MaxSubscriptionsPerConn > 1<<20:
		return bad("max_subscriptions_per_connection", "must be between 1 and %d, got %d", 1<<20, c.MaxSubscriptionsPerConn)
	case c.MaxQueuedResponses < 1:
		return bad("max_queued_responses", "must be at least 1, got %d", c.MaxQueuedResponses)
	case c.MaxPipelinedBytes < 64<<10:
		return bad("max_pipelined_bytes", "must be at least 65536, got %d", c.MaxPipelinedBytes)
	case c.TextAckWait < time.Millisecond || c.TextAckWait > broker.MaxLeaseDuration:
		return bad("text_ack_wait", "must be between 1ms and %s, got %s", broker.MaxLeaseDuration, c.TextAckWait)
	case c.TextMaxInFlight < 1 || c.TextMaxInFlight > c.MaxCredit:
		return bad("text_max_in_flight", "must be between 1 and max_credit (%d), got %d", c.MaxCredit, c.TextMaxInFlight)
	case c.TextPublisherIdle < time.Millisecond:
		return bad("text_publisher_idle", "must be at least 1ms, got %s", c.TextPublisherIdle)
	case c.MaxConnBufferBytes < 64<<10 || c.MaxConnBufferBytes > 1<<30:
		return bad("max_conn_buffer_bytes", "must be between 65536 and 1073741824, got %d", c.MaxConnBufferBytes)
	case c.TextAckTimeout < time.Millisecond || c.TextAckTimeout > c.TextAckWait:
		return bad("text_ack_timeout", "must be between 1ms and text_ack_wait (%s), got %s", c.TextAckWait, c.TextAckTimeout)
	case c.MaxMessageSize < 1 || c.MaxMessageSize > storage.MaxMessageBytesLimit:
		return bad("max_message_size", "must be between 1 and %d, got %d", storage.MaxMessageBytesLimit, c.MaxMessageSize)
	}
	return nil
}

// sessionRatio is SessionTimeout / HeartbeatInterval: a session that negotiates another heartbeat
// interval gets the same ratio.
func (c Config) sessionRatio() float64 {
	return float64(c.SessionTimeout) / float64(c.HeartbeatInterval)
}

// negotiateHeartbeat returns the heartbeat interval and session timeout of a session whose Hello
// asked for requested (0: the default).
func (c Config) negotiateHeartbeat(requested time.Duration) (interval, timeout time.Duration) {
	interval = requested
	if interval == 0 {
		interval = c.HeartbeatInterval
	}
	interval = min(max(interval, c.MinHeartbeatInterval), c.MaxHeartbeatInterval)
	timeout = time.Duration(float64(interval) * c.sessionRatio())
	return interval, timeout
}
