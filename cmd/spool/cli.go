package main

// The client commands (pub, sub, topic, group, dlq) share this file: their environment (streams,
// variables, terminal), flag parsing with flags anywhere among the arguments, usage errors, exit
// codes and error output.
//
// Exit codes: 0 success (also -h, and sub ended by SIGINT); 1 an error of the broker, the API or
// the system, printed as "spool: <CODE>: <message>" (or "spool: <message>" without a code); 2 a
// usage error, printed with the command's usage. The command functions return errors and never
// exit, so tests run them in-process through runCLI; only the wrapper registered with addCommand
// calls os.Exit.

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/cli"
	"github.com/spoolmq/spool/internal/tlsconf"
	"github.com/spoolmq/spool/protocol"
)

// Environment variables and defaults of the client commands' addresses. Flags override the
// variables, which override the defaults.
const (
	envAddr = "SPOOL_ADDR"
	envHTTP = "SPOOL_HTTP"
	// envToken is the token of the client commands (brokers with authentication); --token-file
	// overrides it.
	envToken        = "SPOOL_TOKEN"
	defaultAddr     = "localhost:9092"
	defaultHTTPAddr = "http://localhost:8080"
	// closeTimeout bounds the clean shutdown of a command's client (flush, unsubscribe, Goodbye)
	// after its work or a SIGINT.
	closeTimeout = 30 * time.Second
)

// cliEnv is what a client command sees of the world, so that tests can run commands in-process.
type cliEnv struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// stderrTTY reports that stderr is a terminal: progress lines go there.
	stderrTTY bool
	// loc is the time zone of human output.
	loc *time.Location
	// httpClient calls the admin API; nil means cli.NewAdminClient's default.
	httpClient *http.Client
	// clientOpts are added to every Dial (tests: a logger).
	clientOpts []client.Opt
	// tls holds the --tls-* flags once addrFlag or httpFlag defined them.
	tls *tlsFlags
}

// tlsFlags are --tls-ca, --tls-cert and --tls-key: any of them makes the command connect with TLS
// (the broker's listeners with server.tls set); and --token-file, the credential of a broker with
// authentication.
type tlsFlags struct {
	ca, cert, key *string
	tokenFile     *string
}

// defineTLSFlags defines the --tls-* flags on fs (once).
func (e *cliEnv) defineTLSFlags(fs *flag.FlagSet) {
	if fs.Lookup("tls-ca") != nil {
		return
	}
	e.tls = &tlsFlags{
		ca:        fs.String("tls-ca", "", "PEM file of the CA that signed the broker's certificate (connect with TLS; default: the system's CAs)"),
		cert:      fs.String("tls-cert", "", "PEM client certificate for mutual TLS (with --tls-key; connect with TLS)"),
		key:       fs.String("tls-key", "", "PEM private key of --tls-cert"),
		tokenFile: fs.String("token-file", "", "file whose first line is the token of a broker with authentication ($"+envToken+" otherwise)"),
	}
}

// token returns the credential: the first line of --token-file, else $SPOOL_TOKEN, else "".
func (e *cliEnv) token() (string, error) {
	if e.tls == nil || *e.tls.tokenFile == "" {
		return e.getenv(envToken), nil
	}
	return readTokenFile(*e.tls.tokenFile)
}

// errEmptyTokenFile: a --token-file whose first line is empty. Sending no token would make a
// broker with authentication answer NOT_AUTHENTICATED, and hide the mistake in the file.
var errEmptyTokenFile = errors.New("--token-file: the first line holds no token")

// readTokenFile returns the first line of a --token-file, without surrounding spaces; an empty
// one is errEmptyTokenFile.
func readTokenFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return "", fmt.Errorf("%w: %s", errEmptyTokenFile, path)
	}
	return line, nil
}

// bearer adds "Authorization: Bearer <token>" to every request of an admin API client.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// tlsConfig returns the TLS configuration of the --tls-* flags, nil when none was given.
func (e *cliEnv) tlsConfig() (*tls.Config, error) {
	if e.tls == nil || *e.tls.ca == "" && *e.tls.cert == "" && *e.tls.key == "" {
		return nil, nil
	}
	return tlsconf.ClientConfig(*e.tls.ca, *e.tls.cert, *e.tls.key)
}

// osEnv is the environment of the real process.
func osEnv() *cliEnv {
	return &cliEnv{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv,
		stderrTTY: cliIsTerminal(os.Stderr), loc: time.Local,
	}
}

// cliIsTerminal reports whether f is a character device (a terminal; also /dev/null, which is
// harmless for progress lines).
func cliIsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// cliFunc is a client command: it parses args itself and returns an error (see runCLI).
type cliFunc func(ctx context.Context, e *cliEnv, args []string) error

func init() {
	for _, c := range []struct {
		name, summary string
		run           cliFunc
	}{
		{"pub", "publish messages (arguments, a file, or stdin lines)", runPub},
		{"sub", "consume a topic or pattern and print the deliveries", runSub},
		{"topic", "create, list, describe, update and delete topics (HTTP API)", runTopic},
		{"group", "list, describe, pause, resume, cancel, remove, resurrect, force-complete groups (HTTP API)", runGroup},
		{"dlq", "list, replay and purge dead-letter queues (HTTP API)", runDLQ},
		{"doctor", "answer why a group does not receive, is DEAD, why messages stay, why writes are blocked", runDoctor},
	} {
		addCommand(command{name: c.name, summary: c.summary, run: func(ctx context.Context, args []string) error {
			if code := runCLI(ctx, osEnv(), c.run, args); code != 0 {
				os.Exit(code)
			}
			return nil
		}})
	}
}

// runCLI runs a client command and returns its exit code after printing its error, if any, on
// stderr.
func runCLI(ctx context.Context, e *cliEnv, run cliFunc, args []string) int {
	if e.loc == nil {
		e.loc = time.Local
	}
	if e.getenv == nil {
		e.getenv = func(string) string { return "" }
	}
	// Handlers, hooks and progress write concurrently: whole writes must not interleave.
	e.stdout = &lockedWriter{w: e.stdout}
	e.stderr = &lockedWriter{w: e.stderr}
	return exitCode(run(ctx, e, args), e.stderr)
}

// errorText returns what the CLI prints for err: "CODE: message" for an error of the broker or
// the admin API (the context the CLI added is dropped: the code and the broker's message say it),
// else the error's text.
func errorText(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Error()
	}
	var ae *cli.APIError
	if errors.As(err, &ae) {
		return ae.Error()
	}
	return err.Error()
}

// usageError is a usage mistake: exit status 2 with the command's usage.
type usageError struct {
	// msg says what is wrong; empty when the flag package already said it.
	msg string
	// usage prints the command's usage on stderr; nil when it was already printed.
	usage func()
}

// report prints the error on w (unless the flag package already did), then the usage (unless
// already printed).
func (e *usageError) report(w io.Writer) {
	if e.msg != "" {
		fmt.Fprintf(w, "spool: %s\n", e.msg)
		if e.usage != nil {
			fmt.Fprintln(w)
		}
	}
	if e.usage != nil {
		e.usage()
	}
}

func (e *usageError) Error() string {
	if e.msg == "" {
		return "usage error"
	}
	return e.msg
}

// usagef returns a usage error of the command whose flags are fs.
func usagef(fs *flag.FlagSet, format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...), usage: fs.Usage}
}

// cmdSpec describes a command for its -h text.
type cmdSpec struct {
	// name is the command's words after spool ("topic create").
	name string
	// args is the synopsis after the name ("[flags] <topic> [payload ...]").
	args string
	// desc is a paragraph on what it does.
	desc string
	// examples are command lines.
	examples []string
}

// flagSet returns the flag set of a command: errors and -h go to stderr, usage ends with the
// examples.
func (e *cliEnv) flagSet(spec cmdSpec) *flag.FlagSet {
	fs := flag.NewFlagSet(spec.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: spool %s %s\n\n%s\n", spec.name, spec.args, strings.TrimSpace(spec.desc))
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprint(w, "\nFlags:\n")
			fs.PrintDefaults()
		}
		if len(spec.examples) > 0 {
			fmt.Fprint(w, "\nExamples:\n")
			for _, ex := range spec.examples {
				fmt.Fprintf(w, "  %s\n", ex)
			}
		}
	}
	return fs
}

// parseArgs parses flags found anywhere among args (flag stops at the first non-flag argument;
// this resumes after it) and returns the positional arguments. Everything after "--" is
// positional. Errors: flag.ErrHelp for -h, a *usageError (already printed) for a bad flag.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// fs.Parse consumed a "--" right before rest if there was one.
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseFlagsOnly parses the flags of a command that takes no positional arguments (serve, migrate,
// the bench modes): flag.ErrHelp for -h, a *usageError for a bad flag (already printed) or an
// argument.
func parseFlagsOnly(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{}
	}
	if fs.NArg() > 0 {
		return usagef(fs, "%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	return nil
}

// wantArgs checks the number of positional arguments.
func wantArgs(fs *flag.FlagSet, pos []string, minN, maxN int, what string) error {
	switch {
	case len(pos) < minN:
		return usagef(fs, "%s: missing %s", fs.Name(), what)
	case maxN >= 0 && len(pos) > maxN:
		return usagef(fs, "%s: unexpected arguments %q", fs.Name(), pos[maxN:])
	}
	return nil
}

// addrFlag defines --addr, the broker's TCP address: SPOOL_ADDR, else localhost:9092.
func (e *cliEnv) addrFlag(fs *flag.FlagSet) *string {
	def := e.getenv(envAddr)
	if def == "" {
		def = defaultAddr
	}
	e.defineTLSFlags(fs)
	return fs.String("addr", def, "broker address host:port, binary protocol ($"+envAddr+" overrides the default)")
}

// httpFlag defines --http, the admin API's address: SPOOL_HTTP, else http://localhost:8080.
func (e *cliEnv) httpFlag(fs *flag.FlagSet) *string {
	def := e.getenv(envHTTP)
	if def == "" {
		def = defaultHTTPAddr
	}
	e.defineTLSFlags(fs)
	return fs.String("http", def, "admin API address, a URL or host:port (https:// with the --tls-* flags) ($"+envHTTP+" overrides the default)")
}

// admin returns the admin API client of --http.
func (e *cliEnv) admin(fs *flag.FlagSet, addr string) (*cli.AdminClient, error) {
	hc := e.httpClient
	tc, err := e.tlsConfig()
	if err != nil {
		return nil, usagef(fs, "%v", err)
	}
	if tc != nil {
		if base, err := cli.BaseURL(addr); err == nil && !strings.Contains(addr, "://") {
			addr = "https://" + strings.TrimPrefix(base, "http://") // host:port: TLS was asked for
		}
		if base, err := cli.BaseURL(addr); err == nil && !strings.HasPrefix(base, "https://") {
			return nil, usagef(fs, "--tls-* flags need an https:// admin API address, got %q", addr)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tc
		hc = &http.Client{Timeout: cli.DefaultAdminTimeout, Transport: tr}
	}
	token, err := e.token()
	if err != nil {
		return nil, usagef(fs, "%v", err)
	}
	if token != "" {
		if hc == nil {
			hc = &http.Client{Timeout: cli.DefaultAdminTimeout}
		}
		base := hc.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		withToken := *hc
		withToken.Transport = &bearer{token: token, base: base}
		hc = &withToken
	}
	c, err := cli.NewAdminClient(addr, hc)
	if err != nil {
		return nil, usagef(fs, "%v", err)
	}
	return c, nil
}

// adminArgs parses the arguments of an admin API command that has nothing else to check, wants
// between minN and maxN positional arguments (what names the missing ones) and returns them with
// the client of --http (httpAddr).
func (e *cliEnv) adminArgs(fs *flag.FlagSet, httpAddr *string, args []string, minN, maxN int, what string) ([]string, *cli.AdminClient, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if err := wantArgs(fs, pos, minN, maxN, what); err != nil {
		return nil, nil, err
	}
	api, err := e.admin(fs, *httpAddr)
	if err != nil {
		return nil, nil, err
	}
	return pos, api, nil
}

// brokerClient is a client of the broker that tells the user on stderr when its connection breaks
// and comes back.
type brokerClient struct {
	*client.Client
	notes *connNotices
}

// Close closes the client; the connection ending then is no news.
func (c *brokerClient) Close(ctx context.Context) error {
	c.notes.closing.Store(true)
	return c.Client.Close(ctx)
}

// dial connects to the broker at addr; hooks are added to the client's (see client.Hooks).
func (e *cliEnv) dial(ctx context.Context, addr, name string, hooks ...any) (*brokerClient, error) {
	notes := &connNotices{e: e}
	opts := append([]client.Opt{client.ClientName("spool " + name), client.Hooks(append([]any{notes}, hooks...)...)}, e.clientOpts...)
	tc, err := e.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, client.TLSConfig(tc))
	}
	token, err := e.token()
	if err != nil {
		return nil, err
	}
	if token != "" {
		opts = append(opts, client.Token(token))
	}
	c, err := client.Dial(ctx, addr, opts...)
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) || ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("cannot connect to the broker at %s (set --addr or %s): %w", addr, envAddr, err)
	}
	return &brokerClient{Client: c, notes: notes}, nil
}

// closeCtx returns the context of a clean shutdown after ctx (possibly cancelled by SIGINT) ended.
func closeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
}

// connNotices tells the user on stderr when the client's connection breaks and comes back.
type connNotices struct {
	e *cliEnv
	// closing is set by brokerClient.Close: the client's own Goodbye ends the connection too, and
	// its DisconnectEvent does not always carry ErrClientClosed.
	closing atomic.Bool
}

// OnConnect implements client.ConnectHook.
func (n *connNotices) OnConnect(ev client.ConnectEvent) {
	if ev.Reconnect {
		fmt.Fprintf(n.e.stderr, "spool: reconnected to %s\n", ev.Addr)
	}
}

// OnDisconnect implements client.DisconnectHook.
func (n *connNotices) OnDisconnect(ev client.DisconnectEvent) {
	if ev.Err != nil && !errors.Is(ev.Err, client.ErrClientClosed) && !n.closing.Load() {
		fmt.Fprintf(n.e.stderr, "spool: connection to %s lost (%v); reconnecting\n", ev.Addr, ev.Err)
	}
}

// lockedWriter serializes writes.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// subcommand is one word of a command group (topic create, group list, ...).
type subcommand struct {
	name, summary string
	run           cliFunc
}

// dispatch runs the subcommand named by args[0], or prints the group's usage.
func dispatch(ctx context.Context, e *cliEnv, group, desc string, subs []subcommand, args []string) error {
	usage := func() {
		fmt.Fprintf(e.stderr, "Usage: spool %s <command> [flags] [arguments]\n\n%s\n\nCommands:\n", group, desc)
		for _, s := range subs {
			fmt.Fprintf(e.stderr, "  %-10s %s\n", s.name, s.summary)
		}
		fmt.Fprintf(e.stderr, "\nRun \"spool %s <command> -h\" for the flags and an example.\n", group)
	}
	if len(args) == 0 {
		return &usageError{msg: group + ": missing command", usage: usage}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage()
		return flag.ErrHelp
	}
	i := slices.IndexFunc(subs, func(s subcommand) bool { return s.name == args[0] })
	if i < 0 {
		return &usageError{msg: fmt.Sprintf("%s: unknown command %q", group, args[0]), usage: usage}
	}
	return subs[i].run(ctx, e, args[1:])
}
