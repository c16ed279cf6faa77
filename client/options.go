package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spoolmq/spool/protocol"
)

// Defaults of the client options.
const (
	// DefaultDialTimeout bounds one connection attempt: dial, TLS and the protocol handshake.
	DefaultDialTimeout = 10 * time.Second
	// DefaultReconnectBackoffMin and DefaultReconnectBackoffMax bound the wait between reconnect
	// attempts; it doubles from the minimum on every failed attempt.
	DefaultReconnectBackoffMin = 100 * time.Millisecond
	DefaultReconnectBackoffMax = 10 * time.Second
	// DefaultReconnectJitter is the fraction by which each backoff is randomized (0.2: ±20 %).
	DefaultReconnectJitter = 0.2
	// DefaultMaxAsyncInFlight is the size of the PublishAsync window.
	DefaultMaxAsyncInFlight = 1024
	// DefaultAsyncPublishTimeout bounds how long PublishAsync keeps retrying one message.
	DefaultAsyncPublishTimeout = 30 * time.Second
)

// Opt configures a Client in Dial. The interface is sealed: only the functions of this package
// (ClientName, Token, DialTimeout, ...) create options.
type Opt interface {
	applyClient(*config)
}

// SubscribeOpt configures one Subscription in Client.Subscribe. The interface is sealed: only the
// functions of this package (Concurrency, ManualAck, NackDelay, ...) create options.
type SubscribeOpt interface {
	applySub(*subConfig)
}

type clientOpt func(*config)

func (f clientOpt) applyClient(c *config) { f(c) }

type subOpt func(*subConfig)

func (f subOpt) applySub(c *subConfig) { f(c) }

// config is the validated configuration of a Client; defaults are applied by newConfig.
type config struct {
	clientName          string
	token               string
	dialTimeout         time.Duration
	tlsConfig           *tls.Config
	dial                func(ctx context.Context, network, addr string) (net.Conn, error)
	logger              *slog.Logger
	hooks               []any
	backoffMin          time.Duration
	backoffMax          time.Duration
	jitter              float64
	maxFrameSize        int
	heartbeatInterval   time.Duration
	maxAsyncInFlight    int
	asyncPublishTimeout time.Duration
}

func newConfig(opts []Opt) (config, error) {
	cfg := config{
		dialTimeout:         DefaultDialTimeout,
		backoffMin:          DefaultReconnectBackoffMin,
		backoffMax:          DefaultReconnectBackoffMax,
		jitter:              DefaultReconnectJitter,
		maxAsyncInFlight:    DefaultMaxAsyncInFlight,
		asyncPublishTimeout: DefaultAsyncPublishTimeout,
	}
	for _, o := range opts {
		if o != nil {
			o.applyClient(&cfg)
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	return cfg, cfg.validate()
}

// validate checks every field and the fields against each other; the error names the option.
func (c *config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("client: %w: %s", protocol.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case c.dialTimeout <= 0:
		return bad("DialTimeout %v must be positive", c.dialTimeout)
	case c.backoffMin <= 0 || c.backoffMax < c.backoffMin:
		return bad("ReconnectBackoff min %v and max %v: need 0 < min <= max", c.backoffMin, c.backoffMax)
	case c.jitter < 0 || c.jitter > 1:
		return bad("ReconnectBackoff jitter %v must be in [0, 1]", c.jitter)
	case c.maxFrameSize != 0 && (c.maxFrameSize < protocol.MinMaxFrameSize || c.maxFrameSize > protocol.MaxMaxFrameSize):
		return bad("MaxFrameSize %d must be between %d and %d", c.maxFrameSize, protocol.MinMaxFrameSize, protocol.MaxMaxFrameSize)
	case c.heartbeatInterval < 0 || c.heartbeatInterval > protocol.MaxDuration:
		return bad("HeartbeatInterval %v out of range", c.heartbeatInterval)
	case c.maxAsyncInFlight < 1:
		return bad("MaxAsyncInFlight %d must be at least 1", c.maxAsyncInFlight)
	case c.asyncPublishTimeout <= 0:
		return bad("AsyncPublishTimeout %v must be positive", c.asyncPublishTimeout)
	}
	for i, h := range c.hooks {
		if !isHook(h) {
			return bad("Hooks: value %d (%T) implements no hook interface", i, h)
		}
	}
	return nil
}

// ClientName names the application in the broker's logs and admin listings (Hello.client_name).
// Defaults to "".
func ClientName(name string) Opt { return clientOpt(func(c *config) { c.clientName = name }) }

// Token sets the bearer token sent in the handshake, for brokers that require authentication.
// Defaults to "" (no credentials).
func Token(token string) Opt { return clientOpt(func(c *config) { c.token = token }) }

// DialTimeout bounds one connection attempt: TCP dial, TLS handshake and protocol handshake.
// Defaults to DefaultDialTimeout (10 s).
func DialTimeout(d time.Duration) Opt { return clientOpt(func(c *config) { c.dialTimeout = d }) }

// TLSConfig makes the client connect with TLS using cfg (cloned; ServerName defaults to the host
// of the address). Defaults to nil: plain TCP.
func TLSConfig(cfg *tls.Config) Opt {
	return clientOpt(func(c *config) {
		if cfg != nil {
			cfg = cfg.Clone()
		}
		c.tlsConfig = cfg
	})
}

// Dialer replaces the function that opens connections (default: a net.Dialer with keepalive,
// DialContext("tcp", addr)), for proxies, unix sockets or in-memory pipes in tests. With TLSConfig
// set, TLS runs on top of the returned connection.
func Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Opt {
	return clientOpt(func(c *config) { c.dial = dial })
}

// Logger sets the logger of the client; it logs with the attribute component=client. Defaults to
// nil: logs are discarded.
func Logger(l *slog.Logger) Opt { return clientOpt(func(c *config) { c.logger = l }) }

// Hooks registers values that observe the client: each must implement at least one of
// ConnectHook, DisconnectHook, PublishHook, HandleHook and SubscriptionEndedHook. Hooks are called
// synchronously from the client's goroutines, possibly concurrently: they must be fast and safe
// for concurrent use. Metrics adapters (Prometheus, ...) are built on them outside this package.
func Hooks(hooks ...any) Opt {
	return clientOpt(func(c *config) { c.hooks = append(c.hooks, hooks...) })
}

// ReconnectBackoff sets the wait between reconnect attempts after a broken connection: it starts
// at min, doubles on every failed attempt up to max, and is randomized by ±jitter (a fraction in
// [0, 1]). Defaults to 100 ms, 10 s, 0.2. The client reconnects until it is closed.
func ReconnectBackoff(min, max time.Duration, jitter float64) Opt {
	return clientOpt(func(c *config) { c.backoffMin, c.backoffMax, c.jitter = min, max, jitter })
}

// MaxFrameSize caps the frames this client sends, header included (between 64 KiB and 1 GiB);
// the broker's HelloOK.max_frame_size caps it further and bounds the frames the client receives,
// as the protocol requires. A publish whose frame exceeds the cap fails with an error wrapping
// protocol.ErrFrameTooLarge. Defaults to 0: the broker's value.
func MaxFrameSize(n int) Opt { return clientOpt(func(c *config) { c.maxFrameSize = n }) }

// HeartbeatInterval asks the broker for this heartbeat interval (it clamps it, by default to
// [1 s, 60 s], and announces the result with the session timeout). Defaults to 0: the broker's
// default (10 s, session timeout 30 s).
func HeartbeatInterval(d time.Duration) Opt {
	return clientOpt(func(c *config) { c.heartbeatInterval = d })
}

// MaxAsyncInFlight bounds the PublishAsync window: the number of async publishes accepted and not
// yet completed (callback returned). When the window is full, PublishAsync blocks. Defaults to
// DefaultMaxAsyncInFlight (1024).
func MaxAsyncInFlight(n int) Opt { return clientOpt(func(c *config) { c.maxAsyncInFlight = n }) }

// AsyncPublishTimeout bounds how long the client keeps trying one PublishAsync message (waiting
// for a connection, retrying retryable errors) before its callback gets an error wrapping
// context.DeadlineExceeded. Defaults to DefaultAsyncPublishTimeout (30 s).
func AsyncPublishTimeout(d time.Duration) Opt {
	return clientOpt(func(c *config) { c.asyncPublishTimeout = d })
}

// subConfig is the configuration of one Subscription.
type subConfig struct {
	concurrency   int
	manualAck     bool
	nackDelay     time.Duration
	memberID      string
	leaseDuration time.Duration
}

func newSubConfig(opts []SubscribeOpt) (subConfig, error) {
	cfg := subConfig{concurrency: 1}
	for _, o := range opts {
		if o != nil {
			o.applySub(&cfg)
		}
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("client: subscribe: %w: %s", protocol.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.concurrency < 1 || cfg.concurrency > maxConcurrency:
		return cfg, bad("Concurrency %d must be between 1 and %d", cfg.concurrency, maxConcurrency)
	case cfg.nackDelay < 0 || cfg.nackDelay > protocol.MaxDuration:
		return cfg, bad("NackDelay %v out of range", cfg.nackDelay)
	case cfg.leaseDuration < 0 || cfg.leaseDuration > protocol.MaxDuration:
		return cfg, bad("LeaseDuration %v out of range", cfg.leaseDuration)
	}
	return cfg, nil
}

// maxConcurrency bounds the handler goroutines of one subscription (the broker caps credit at
// 65 536 by default; more workers than credit would idle).
const maxConcurrency = 65536

// Concurrency sets the number of handler goroutines of a subscription: at most n handlers run at
// a time. Defaults to 1.
func Concurrency(n int) SubscribeOpt { return subOpt(func(c *subConfig) { c.concurrency = n }) }

// ManualAck turns automatic settlement off: the handler's return value is only logged (and passed
// to HandleHook), and the application settles each delivery with Delivery.Ack or Delivery.Nack,
// possibly after the handler returned. A delivery never settled is redelivered when its lease
// expires. Defaults to off: nil from the handler acks, an error nacks.
func ManualAck() SubscribeOpt { return subOpt(func(c *subConfig) { c.manualAck = true }) }

// NackDelay sets how long a delivery nacked because its handler returned an error waits before it
// is redelivered. Defaults to 0: at once, to another member of the group where one has credit.
// NackWithDelay overrides it per error; ToDLQ sends the message to the dead-letter queue instead.
func NackDelay(d time.Duration) SubscribeOpt { return subOpt(func(c *subConfig) { c.nackDelay = d }) }

// MemberID names this member inside its group (Subscribe.member_id), for admin listings; it must
// be unique among the broker's live members of the client's principal (a broker that
// authenticates scopes member ids by principal: another principal's member may use the same id
// and is another member, listed as <id>@<principal>). Defaults to "": the broker assigns one per
// connection. After a broken connection the broker may still hold the previous connection's
// member with the same id until it notices the break (up to its session timeout) and refuses the
// resubscription with INVALID_ARGUMENT until then; the client keeps retrying with backoff.
func MemberID(id string) SubscribeOpt { return subOpt(func(c *subConfig) { c.memberID = id }) }

// LeaseDuration overrides the topic's ack_wait for this subscription's deliveries
// (Subscribe.lease_duration). Defaults to 0: the topic's ack_wait (30 s by default).
func LeaseDuration(d time.Duration) SubscribeOpt {
	return subOpt(func(c *subConfig) { c.leaseDuration = d })
}
