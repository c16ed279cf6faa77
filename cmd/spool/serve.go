package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/assemble"
	"github.com/spoolmq/spool/internal/auth"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/config"
	"github.com/spoolmq/spool/internal/metrics"
	"github.com/spoolmq/spool/internal/server"
	"github.com/spoolmq/spool/internal/storage/wal"
	"github.com/spoolmq/spool/internal/tlsconf"
	"github.com/spoolmq/spool/protocol"
)

// serveFlags maps the flags of spool serve to their configuration keys.
var serveFlags = map[string]string{
	"listen":         "listen",
	"http":           "http",
	"data-dir":       "data_dir",
	"store":          "store",
	"log-level":      "log_level",
	"unsafe-no-sync": "wal.unsafe_no_sync",
	"insecure":       "insecure",
}

// serve runs the broker until ctx is cancelled (SIGINT, SIGTERM), then shuts down in order (see
// shutdown).
func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: spool serve [flags]\n\n"+
			"Runs the broker: TCP (binary protocol and text mode), HTTP (admin API, dashboard at /, /metrics, /healthz, /readyz).\n"+
			"Settings come from the defaults, then --config (or $SPOOL_CONFIG), then SPOOL_* variables\n"+
			"(SPOOL_<KEY>, e.g. SPOOL_SERVER_MAX_CONNECTIONS; any other SPOOL_* variable but SPOOL_CONFIG,\n"+
			"SPOOL_ADDR, SPOOL_TOKEN and SPOOL_TEST_* is an error), then these flags.\n"+
			"TLS on both listeners: server.tls.cert_file and key_file (SPOOL_SERVER_TLS_CERT_FILE, ...),\n"+
			"client_ca_file for mutual TLS; SIGHUP reloads the certificate (docs/protocol.md 2.1.1).\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExamples:\n"+
			"  spool serve\n"+
			"  spool serve --data-dir /var/lib/spool --log-level debug\n"+
			"  spool serve --config /etc/spool/spool.yaml\n"+
			"  SPOOL_BROKER_SLOW_OPERATION=50ms spool serve --listen 127.0.0.1:9093 --http 127.0.0.1:8081\n"+
			"  spool serve --store postgres://spool@127.0.0.1:5432/app\n")
	}
	configFile := fs.String("config", "", "YAML configuration file (default $SPOOL_CONFIG, else none)")
	def := config.Defaults()
	fs.String("listen", def.Listen, "TCP address of the binary protocol and the text mode")
	fs.String("http", def.HTTP, "HTTP address of the admin API, the dashboard (/), /metrics, /healthz and /readyz")
	fs.String("data-dir", def.DataDir, "directory of the embedded engine")
	fs.String("store", def.Store, "engine: empty for the embedded engine in --data-dir, or a postgres:// URL (PostgreSQL engine)")
	fs.String("log-level", def.LogLevel, "debug, info, warn or error (JSON logs on stderr)")
	fs.Bool("unsafe-no-sync", def.WAL.UnsafeNoSync, "acknowledge before fsync: a machine crash loses acknowledged messages")
	fs.Bool("insecure", def.Insecure, "let --listen and --http be addresses other hosts reach although auth.principals is empty: no authentication (trusted networks only)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(fs, *configFile, serveFlags)
	if err != nil {
		return err
	}
	level, _ := cfg.SlogLevel()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return run(ctx, cfg, logger)
}

// loadConfig loads the settings of serve and migrate: the defaults, then configFile (or
// $SPOOL_CONFIG), then the SPOOL_* variables, then the flags of fs given on the command line
// (keys maps a flag's name to its configuration key).
func loadConfig(fs *flag.FlagSet, configFile string, keys map[string]string) (config.Config, error) {
	return loadConfigWith(config.Load, fs, configFile, keys)
}

// loadConfigWith is loadConfig with the loader load (config.Load, or config.LoadStore for a
// command that only opens the store).
func loadConfigWith(load func(string, []string, map[string]string) (config.Config, error), fs *flag.FlagSet,
	configFile string, keys map[string]string) (config.Config, error) {
	flags := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		if key, ok := keys[f.Name]; ok {
			flags[key] = f.Value.String()
		}
	})
	return load(configFile, os.Environ(), flags)
}

// logExposure says who can reach the listeners and who may use them: with authentication on, the
// principals (and a warning when tokens cross the network without TLS); without it, loopback only
// (and how to open them), or anyone (--insecure).
func logExposure(logger *slog.Logger, cfg config.Config) {
	loopback := config.IsLoopback(cfg.Listen) && config.IsLoopback(cfg.HTTP)
	switch {
	case cfg.Auth.Enabled():
		logger.Info("authentication on: clients need a token or a client certificate naming a principal",
			slog.Int("principals", len(cfg.Auth.Principals)), slog.Bool("open_metrics", cfg.Auth.OpenMetrics))
		if !loopback && !cfg.Server.TLS.Enabled() {
			logger.Warn("listening on addresses other hosts may reach without TLS: tokens and messages cross the network in clear (set server.tls)",
				slog.String("tcp", cfg.Listen), slog.String("http", cfg.HTTP))
		}
	case loopback:
		logger.Info("listening on loopback only: other hosts cannot connect; configure auth.principals to listen on any address, or pass --insecure with --listen and --http on a trusted network")
	default:
		logger.Warn("listening without authentication on addresses other hosts may reach (--insecure): anyone who connects can publish, consume, purge and delete",
			slog.String("tcp", cfg.Listen), slog.String("http", cfg.HTTP))
	}
}

// engineAttr names the engine in the start-up log: the store URL without its password on
// PostgreSQL (data_dir is not used there), else the embedded engine's data_dir.
func engineAttr(cfg config.Config) slog.Attr {
	if cfg.Store != "" {
		return slog.String("store", cfg.Redacted())
	}
	return slog.String("data_dir", cfg.DataDir)
}

// run starts every component, waits for ctx (or a listener failure), and shuts down.
func run(ctx context.Context, cfg config.Config, logger *slog.Logger) (err error) {
	ver := buildVersion()

	// Metrics: one registry, exported by the admin handler on /metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	// Engine.
	eng, err := assemble.OpenEngine(ctx, cfg, logger, m)
	if err != nil {
		return err
	}
	defer func() {
		// Last: flush and close the engine (embedded: committer, snapshot, files; PostgreSQL: the
		// instance's ephemeral subscriptions, the pool).
		if cerr := eng.Close(); cerr != nil {
			logger.Error("engine close", slog.Any("error", cerr))
			err = errors.Join(err, cerr)
		}
	}()

	// Broker.
	b, err := broker.New(assemble.BrokerConfig(cfg, eng, logger, m))
	if err != nil {
		return err
	}
	if err := b.Start(ctx); err != nil {
		return err
	}
	stopCtx := stopper(ctx, cfg.ShutdownTimeout)
	defer func() {
		sctx, cancel := stopCtx()
		defer cancel()
		if serr := b.Stop(sctx); serr != nil {
			logger.Error("broker stop", slog.Any("error", serr))
			err = errors.Join(err, serr)
		}
	}()
	if err := m.RegisterBroker(b, metrics.CollectorOptions{Logger: logger}); err != nil {
		return err
	}
	if cfg.Store == "" {
		// The embedded engine's file system: spool_storage_available_bytes and _size_bytes.
		if err := m.RegisterDiskSpace(cfg.DataDir); err != nil {
			return err
		}
		// Its open segment files and dead letters waiting for room: spool_wal_open_files,
		// _max_open_files, _open_files_shed_total, _dlq_held_bytes.
		if we, ok := eng.(*wal.Engine); ok {
			read := func() metrics.WALStats {
				st := we.OpenFiles()
				return metrics.WALStats{Open: st.Open, Max: st.Max, Shed: st.Shed, DLQHeldBytes: we.DLQHeld()}
			}
			if err := m.RegisterWAL(read); err != nil {
				return err
			}
		}
	}

	// TLS of both listeners (server.tls), its certificate reloaded on SIGHUP.
	var tlsSrv *tlsconf.Server
	if cfg.Server.TLS.Enabled() {
		if tlsSrv, err = tlsconf.NewServer(cfg.Server.TLS); err != nil {
			return fmt.Errorf("config: server.tls.%w", err)
		}
		stopReload := reloadOnSIGHUP(tlsSrv, logger)
		defer stopReload()
	}

	// Authentication and authorization of both listeners (auth.principals; nil: off).
	authz, err := auth.New(cfg.Auth)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	// TCP server.
	srvCfg := cfg.Server
	srvCfg.Logger, srvCfg.Metrics, srvCfg.Version, srvCfg.Auth = logger, m, ver, authz
	var httpTLS *tls.Config
	if tlsSrv != nil {
		srvCfg.TLSConfig = tlsSrv.Config()
		httpTLS = tlsSrv.Config("http/1.1")
	}
	srv, err := server.New(srvCfg, b)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if err := srv.Start(ctx, ln); err != nil {
		_ = ln.Close()
		return err
	}

	// HTTP: the admin API with /metrics, /healthz and /readyz (package admin).
	var shuttingDown atomic.Bool
	brokerReady := admin.BrokerReady(b)
	allowedHosts := httpAllowedHosts(cfg)
	adminHandler, err := admin.New(admin.Config{
		Broker:       b,
		Gatherer:     reg,
		Metrics:      m,
		Logger:       logger,
		Auth:         authz,
		AllowedHosts: allowedHosts,
		Sessions:     adminSessions(srv),
		Ready:        readiness(&shuttingDown, brokerReady),
	})
	if err != nil {
		sctx, cancel := stopCtx()
		defer cancel()
		return errors.Join(err, srv.Stop(sctx))
	}
	hl, err := net.Listen("tcp", cfg.HTTP)
	if err != nil {
		sctx, cancel := stopCtx()
		defer cancel()
		return errors.Join(fmt.Errorf("listen %s: %w", cfg.HTTP, err), srv.Stop(sctx))
	}
	// Header, body, write and idle timeouts, and at most http_max_connections connections
	// (admin.NewServer, admin.LimitListener).
	httpSrv := admin.NewServer(adminHandler, logger)
	httpDone := make(chan error, 1)
	go func() {
		httpDone <- httpSrv.Serve(admin.LimitListener(hl, cfg.HTTPMaxConnections, httpTLS, logger.With("component", "admin")))
	}()
	if cfg.DebugListen != "" {
		stopDebug, err := serveDebug(cfg.DebugListen, allowedHosts, logger)
		if err != nil {
			return errors.Join(err, shutdown(stopCtx, logger, &shuttingDown, srv, adminHandler, httpSrv, httpDone))
		}
		defer stopDebug()
	}

	logger.Info("spool serving", slog.String("version", ver), slog.String("tcp", ln.Addr().String()),
		slog.String("http", hl.Addr().String()), engineAttr(cfg), tlsAttr(tlsSrv))
	logExposure(logger, cfg)

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down", slog.String("cause", context.Cause(ctx).Error()))
	case <-srv.Done():
		runErr = fmt.Errorf("tcp listener failed: %w", srv.Err())
	case herr := <-httpDone:
		runErr = fmt.Errorf("http server failed: %w", herr)
		httpDone <- herr
	}
	return errors.Join(runErr, shutdown(stopCtx, logger, &shuttingDown, srv, adminHandler, httpSrv, httpDone))
}

// tlsAttr describes the listeners' TLS in the start-up log: off, on, or mutual (client
// certificates required), with the certificate's expiry.
func tlsAttr(s *tlsconf.Server) slog.Attr {
	switch {
	case s == nil:
		return slog.String("tls", "off")
	case s.Mutual():
		return slog.Group("tls", slog.String("mode", "mutual"), slog.Time("cert_not_after", s.NotAfter()))
	}
	return slog.Group("tls", slog.String("mode", "on"), slog.Time("cert_not_after", s.NotAfter()))
}

// reloadOnSIGHUP reloads the TLS certificate and key on each SIGHUP until stop is called: new
// handshakes get the new certificate, open connections keep theirs. A file that does not load
// leaves the current certificate in place and is logged as an error.
func reloadOnSIGHUP(s *tlsconf.Server, logger *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-hup:
				reloadTLS(s, logger)
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-exited
	}
}

// reloadTLS reloads the certificate once and logs the outcome.
func reloadTLS(s *tlsconf.Server, logger *slog.Logger) {
	if err := s.Reload(); err != nil {
		logger.Error("tls certificate reload failed, keeping the current certificate", slog.Any("error", err),
			slog.Time("cert_not_after", s.NotAfter()))
		return
	}
	logger.Info("tls certificate reloaded", slog.Time("cert_not_after", s.NotAfter()))
}

// httpAllowedHosts are the names, besides IP addresses, localhost and the machine's name, that
// requests to the HTTP and debug listeners may name without authentication (admin.LocalHost):
// http_allowed_hosts and the host name of http, if it is one.
func httpAllowedHosts(cfg config.Config) []string {
	hosts := slices.Clone(cfg.HTTPAllowedHosts)
	if h, _, err := net.SplitHostPort(cfg.HTTP); err == nil && h != "" && net.ParseIP(h) == nil {
		hosts = append(hosts, h)
	}
	return hosts
}

// serveDebug serves net/http/pprof on addr until the returned function is called. Without
// authentication of its own, it refuses requests naming hosts other than allowed (admin.HostGuard).
func serveDebug(addr string, allowed []string, logger *slog.Logger) (stop func(), err error) {
	dl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s (debug_listen): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ds := &http.Server{Handler: admin.HostGuard(mux, allowed), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = ds.Serve(dl) }()
	logger.Warn("pprof debug listener on (no authentication: keep it on loopback)", slog.String("debug_listen", dl.Addr().String()))
	return func() { _ = ds.Close() }, nil
}

// stopper returns the contexts of the shutdown's steps: all of them end at one deadline,
// shutdown_timeout after the first one was asked for (when the shutdown began), so the timeout
// bounds the listeners, sessions, HTTP requests and broker together, not each of them. They do
// not end with parent (the signal that starts the shutdown cancels it).
func stopper(parent context.Context, timeout time.Duration) func() (context.Context, context.CancelFunc) {
	var once sync.Once
	var deadline time.Time
	return func() (context.Context, context.CancelFunc) {
		once.Do(func() { deadline = time.Now().Add(timeout) })
		return context.WithDeadline(context.WithoutCancel(parent), deadline)
	}
}

// shutdown stops the listeners and their sessions; the deferred calls of run then stop the broker
// and close the engine. The order:
//
//  1. /readyz answers 503, so that load balancers stop sending work;
//  2. the TCP server stops accepting, says Goodbye (binary) or ERR CLOSED (text), lets binary
//     clients settle for the grace period, then ends every session: members leave, their leases
//     are released at once, writers flush, sockets close;
//  3. the HTTP pull sessions end (their leases are released), the HTTP server stops accepting and
//     waits for the requests in flight;
//  4. (run) the broker stops its dispatchers and retention job;
//  5. (run) the engine closes: the committer flushes, a snapshot is written, files close.
//
// Steps 1-4 share one deadline (stopper); the engine's close is not cut short (on PostgreSQL its
// queued appends are each bounded by postgres.tx_timeout).
func shutdown(stopCtx func() (context.Context, context.CancelFunc), logger *slog.Logger, shuttingDown *atomic.Bool,
	srv *server.Server, adminHandler *admin.Handler, httpSrv *http.Server, httpDone <-chan error) error {
	ctx, cancel := stopCtx()
	defer cancel()
	shuttingDown.Store(true)
	var errs []error
	if err := srv.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("tcp server stop: %w", err))
	}
	if err := adminHandler.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("admin close: %w", err))
	}
	if err := httpSrv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("http server shutdown: %w", err))
	}
	if err := <-httpDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Warn("http server", slog.Any("error", err))
	}
	err := errors.Join(errs...)
	if err != nil {
		logger.Error("shutdown", slog.Any("error", err))
	}
	return err
}

// readiness is /readyz's check: CLOSED (retryable) from the start of a shutdown, so that a load
// balancer sends new clients elsewhere while this instance drains, else the broker's readiness.
func readiness(shuttingDown *atomic.Bool, brokerReady func() error) func() error {
	return func() error {
		if shuttingDown.Load() {
			return protocol.ErrClosed.WithMessage("shutting down")
		}
		return brokerReady()
	}
}

// adminSessions lists srv's connections for the admin API (GET /admin/connections).
func adminSessions(srv *server.Server) func() []admin.Session {
	return func() []admin.Session {
		var out []admin.Session
		for _, s := range srv.Sessions() {
			out = append(out, admin.Session{ID: s.ID, Mode: s.Mode, Remote: s.Remote, Client: s.Client,
				ProtocolVersion: s.ProtocolVersion, Opened: s.Opened, Members: s.Members})
		}
		return out
	}
}
