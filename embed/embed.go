// Package embed runs a Spool broker inside a Go program: the engine, broker and protocol server
// of spool serve, reached with the client package over in-memory connections (Broker.Dial), and,
// when Config.Listen is set, over TCP by other processes too.
//
//	b, err := embed.Start(ctx, embed.Config{DataDir: "./spool-data"})
//	if err != nil { ... }
//	defer b.Close(context.Background())
//	c, err := b.Dial(ctx)
//	if err != nil { ... }
//	defer c.Close(context.Background())
//	_, err = c.Publish(ctx, "orders.created", client.Message{Payload: body})
//
// Settings are those of spool serve: its configuration file (Config.ConfigFile: principals and
// their permissions too), then settings by dotted key (Config.Settings). The HTTP admin API,
// dashboard and /metrics are spool serve's only, and so is TLS. Config.Listen follows spool
// serve's rule: without principals, loopback addresses only unless the setting insecure is
// "true"; with them, clients authenticate as over TCP (client.Token), in memory too.
//
// Some of spool serve's settings have no use here: http, http_max_connections and
// auth.open_metrics (no HTTP listener), debug_listen (no profiling listener), log_level (the
// level is Config.Logger's) and shutdown_timeout (Close's context bounds the shutdown). Settings
// refuses them; in ConfigFile they are ignored (after spool serve's validation), so that one file
// serves both. server.tls is refused from either.
package embed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/assemble"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage"
)

// Config is what Start runs.
type Config struct {
	// DataDir is the embedded engine's directory (default ./spool-data), unless Store is set.
	DataDir string
	// Store, a postgres:// URL, selects the PostgreSQL engine instead (several brokers, embedded
	// or served, may share its database).
	Store string
	// Listen, when not empty, also serves the binary protocol and the text mode on this TCP
	// address (as spool serve's listen; "127.0.0.1:0" picks a free port, see Broker.Addr).
	Listen string
	// ConfigFile, when not empty, is a configuration file as spool serve reads it (YAML), read
	// first; the environment is not read. Its listen and http are not used (Listen is), its
	// data_dir and store are unless the fields above are set. Its http_max_connections,
	// auth.open_metrics, debug_listen, log_level and shutdown_timeout are ignored (see the
	// package doc), and its server.tls is refused.
	ConfigFile string
	// Settings are further settings by the dotted keys of spool serve's configuration file
	// ("broker.max_topics": "100", "server.max_connections": "50"), validated as spool serve
	// validates them; the keys listen, data_dir and store are refused (the fields above), and so
	// are those an embedded broker has no use for (http, http_max_connections,
	// auth.open_metrics, debug_listen, log_level, shutdown_timeout) and server.tls.
	Settings map[string]string
	// Logger receives the broker's logs (default: none).
	Logger *slog.Logger
}

// serveOnly maps the settings of spool serve that an embedded broker has no use for to the
// reason a Settings entry naming one is refused.
var serveOnly = map[string]string{
	"http":                 "an embedded broker has no HTTP listener (admin API, dashboard, /metrics)",
	"http_max_connections": "an embedded broker has no HTTP listener (admin API, dashboard, /metrics)",
	"auth.open_metrics":    "an embedded broker has no HTTP listener (admin API, dashboard, /metrics)",
	"debug_listen":         "an embedded broker opens no profiling listener (the program may serve net/http/pprof itself)",
	"log_level":            "an embedded broker logs to Config.Logger, at its handler's level",
	"shutdown_timeout":     "the context of Broker.Close bounds the shutdown",
}

// Broker is a running embedded broker.
type Broker struct {
	eng  storage.Engine
	b    *broker.Broker
	srv  *server.Server
	pipe *pipeListener
	tcp  net.Listener
	once sync.Once
	err  error
}

// Start opens the engine, starts the broker and its protocol server, and returns once they
// accept connections; ctx bounds the start only. Bad settings are refused with an error naming
// the setting, and nothing is started. Close stops it.
func Start(ctx context.Context, cfg Config) (*Broker, error) {
	flags := map[string]string{}
	for k, v := range cfg.Settings {
		switch k {
		case "listen", "data_dir", "store":
			return nil, fmt.Errorf("embed: setting %q: use the Config field", k)
		}
		if why, ok := serveOnly[k]; ok {
			return nil, fmt.Errorf("embed: setting %q is spool serve's only: %s", k, why)
		}
		flags[k] = v
	}
	if cfg.DataDir != "" {
		flags["data_dir"] = cfg.DataDir
	}
	if cfg.Store != "" {
		flags["store"] = cfg.Store
	}
	// Only Config.Listen opens a TCP listener, and there is no HTTP one: a listen or http in
	// the file is neither used nor checked.
	flags["listen"], flags["http"] = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Listen != "" {
		flags["listen"] = cfg.Listen
	}
	c, err := config.Load(cfg.ConfigFile, nil, flags)
	if err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	authz, err := auth.New(c.Auth)
	if err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	if c.Server.TLS.Enabled() {
		return nil, errors.New("embed: server.tls is spool serve's only: an embedded broker's TCP listener has no TLS")
	}
	eng, err := assemble.OpenEngine(ctx, c, logger, nil)
	if err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	eb := &Broker{eng: eng, pipe: newPipeListener()}
	fail := func(err error) (*Broker, error) {
		eb.shutdown(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("embed: %w", err)
	}
	if eb.b, err = broker.New(assemble.BrokerConfig(c, eng, logger, nil)); err != nil {
		return fail(err)
	}
	if err := eb.b.Start(ctx); err != nil {
		eb.b = nil
		return fail(err)
	}
	srvCfg := c.Server
	srvCfg.Logger, srvCfg.Auth = logger, authz
	if eb.srv, err = server.New(srvCfg, eb.b); err != nil {
		return fail(err)
	}
	var ln net.Listener = eb.pipe
	if cfg.Listen != "" {
		if eb.tcp, err = net.Listen("tcp", c.Listen); err != nil {
			return fail(fmt.Errorf("listen %s: %w", c.Listen, err))
		}
		ln = eb.pipe.with(eb.tcp)
	}
	if err := eb.srv.Start(ctx, ln); err != nil {
		eb.srv = nil
		return fail(err)
	}
	return eb, nil
}

// Dial connects a client to the broker in memory; opts are the client's (a token when the
// settings name principals, a client name, ...). The client reconnects by itself while the broker
// runs, as over TCP.
func (eb *Broker) Dial(ctx context.Context, opts ...client.Opt) (*client.Client, error) {
	opts = append(opts[:len(opts):len(opts)], client.Dialer(func(ctx context.Context, _, _ string) (net.Conn, error) {
		return eb.pipe.dial(ctx)
	}))
	return client.Dial(ctx, pipeAddr{}.String(), opts...)
}

// Addr is the TCP address of Config.Listen ("" without one).
func (eb *Broker) Addr() string {
	if eb.tcp == nil {
		return ""
	}
	return eb.tcp.Addr().String()
}

// Close stops the server (its clients get Goodbye and a grace to settle their deliveries, within
// ctx), the broker and the engine, in that order. Calls after the first return its result.
func (eb *Broker) Close(ctx context.Context) error {
	eb.once.Do(func() { eb.err = eb.shutdown(ctx) })
	return eb.err
}

// shutdown stops what Start started, last started first.
func (eb *Broker) shutdown(ctx context.Context) error {
	var errs []error
	if eb.srv != nil {
		errs = append(errs, eb.srv.Stop(ctx))
	}
	eb.pipe.Close()
	if eb.tcp != nil {
		_ = eb.tcp.Close()
		eb.pipe.wait()
	}
	if eb.b != nil {
		errs = append(errs, eb.b.Stop(ctx))
	}
	errs = append(errs, eb.eng.Close())
	return errors.Join(errs...)
}
