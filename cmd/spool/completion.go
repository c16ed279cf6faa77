package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Shell completion: "spool completion bash|zsh|fish" prints a script that asks the binary itself
// for candidates ("spool __complete <words>"). The candidates come from the usage texts the
// commands print for -h (their Commands: and Flags: sections), so completion never falls out of
// step with the commands.

func init() {
	addCommand(command{name: "completion", summary: "print a shell completion script: bash, zsh or fish", run: completionCmd})
}

const completionUsage = `Usage: spool completion bash|zsh|fish

Prints a script that completes spool's commands, subcommands and flags in that shell.

Examples:
  source <(spool completion bash)     # this shell; or add the line to ~/.bashrc
  mkdir -p ~/.local/share/bash-completion/completions && spool completion bash > ~/.local/share/bash-completion/completions/spool
  source <(spool completion zsh)      # zsh, after compinit; or save it as _spool in $fpath
  mkdir -p ~/.config/fish/completions && spool completion fish > ~/.config/fish/completions/spool.fish
`

var completionScripts = map[string]string{
	"bash": `# bash completion of spool (spool completion bash)
_spool() {
	local IFS=$'\n'
	COMPREPLY=($(spool __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _spool spool
`,
	"zsh": `#compdef spool
# zsh completion of spool (spool completion zsh)
_spool() {
	local -a cands
	cands=("${(@f)$(spool __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	if [[ -n "${cands[1]}" ]]; then
		compadd -a cands
	else
		_files
	fi
}
compdef _spool spool
`,
	"fish": `# fish completion of spool (spool completion fish)
function __spool_complete
	set -l words (commandline -opc) (commandline -ct)
	spool __complete $words[2..-1] 2>/dev/null
end
complete -c spool -a '(__spool_complete)'
`,
}

// completionCmd is spool completion; with the hidden first argument __complete it prints the
// candidates for the words after "spool" (the last one being completed, possibly empty).
func completionCmd(_ context.Context, args []string) error {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, completionUsage)
		os.Exit(2)
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fmt.Fprint(os.Stdout, completionUsage)
		return nil
	}
	script, ok := completionScripts[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "spool: completion: unknown shell %q\n\n%s", args[0], completionUsage)
		os.Exit(2)
	}
	fmt.Print(script)
	return nil
}

// completeMain runs "spool __complete <words>": it prints one candidate per line.
func completeMain(words []string) {
	self, err := os.Executable()
	if err != nil {
		return
	}
	help := func(args []string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, self, args...).CombinedOutput()
		return string(out)
	}
	for _, c := range complete(words, help) {
		fmt.Println(c)
	}
}

// complete returns the candidates for the last of words (the words after "spool"); help returns
// what "spool <args>" prints (its usage, for args ending in -h).
func complete(words []string, help func(args []string) string) []string {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, before := words[len(words)-1], words[:len(words)-1]
	var cands []string
	switch {
	case len(before) == 0:
		for _, c := range commands {
			cands = append(cands, c.name)
		}
		cands = append(cands, "help", "--version")
	case before[0] == "completion":
		if len(before) == 1 {
			cands = []string{"bash", "zsh", "fish"}
		}
	case strings.HasPrefix(cur, "-"):
		cands = usageFlags(help(append(slices.Clone(before), "-h")))
	case len(before) == 1:
		cands = usageCommands(help([]string{before[0], "-h"}))
	}
	out := cands[:0]
	for _, c := range cands {
		if strings.HasPrefix(c, cur) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

var (
	usageFlagRe    = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9-]*)`)
	usageCommandRe = regexp.MustCompile(`^  ([a-z][a-z0-9-]*)  `)
)

// usageFlags returns the flags ("--name") of a usage text printed by the flag package.
func usageFlags(usage string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(usage))
	for sc.Scan() {
		if m := usageFlagRe.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, "--"+m[1])
		}
	}
	return out
}

// usageCommands returns the subcommands listed in the Commands: section of a usage text.
func usageCommands(usage string) []string {
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(usage))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Commands:":
			in = true
		case in && line == "":
			return out
		case in:
			if m := usageCommandRe.FindStringSubmatch(line + "  "); m != nil {
				out = append(out, m[1])
			}
		}
	}
	return out
}
