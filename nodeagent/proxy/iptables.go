package proxy

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// Commands names the programs the proxy runs. Empty fields mean the host's own, found on PATH. Tests point
// them at wrappers that run the real programs inside a throwaway network namespace.
type Commands struct {
	IPTables, IPTablesSave, IPTablesRestore, Conntrack string
}

func (c Commands) withDefaults() Commands {
	for _, f := range []struct {
		field *string
		name  string
	}{{&c.IPTables, "iptables"}, {&c.IPTablesSave, "iptables-save"}, {&c.IPTablesRestore, "iptables-restore"}, {&c.Conntrack, "conntrack"}} {
		if *f.field == "" {
			*f.field = f.name
		}
	}
	return c
}

// tables are the tables the proxy writes, in the order a restore writes them.
var tables = []string{"filter", "nat"}

// restore loads rules with iptables-restore --noflush: only the chains the input declares change, all in one
// transaction, and -w waits for another writer's lock instead of failing.
func (c Commands) restore(ctx context.Context, rules []byte) error {
	cmd := exec.CommandContext(ctx, c.IPTablesRestore, "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// savedTable is one table as iptables-save prints it.
type savedTable struct {
	chains []string
	rules  []savedRule
}

type savedRule struct {
	chain, spec string // spec is the rule after "-A <chain> ", quoted as iptables-restore reads it back
}

func (r savedRule) target() string {
	fields := strings.Fields(r.spec)
	for i := 0; i+1 < len(fields); i++ {
		if fields[i] == "-j" || fields[i] == "-g" {
			return fields[i+1]
		}
	}
	return ""
}

// comment returns the rule's --comment text, unquoted.
func (r savedRule) comment() string {
	_, rest, ok := strings.Cut(r.spec, "--comment ")
	if !ok {
		return ""
	}
	if !strings.HasPrefix(rest, `"`) {
		text, _, _ := strings.Cut(rest, " ")
		return text
	}
	var b strings.Builder
	for i := 1; i < len(rest); i++ {
		switch rest[i] {
		case '\\':
			if i+1 < len(rest) {
				i++
				b.WriteByte(rest[i])
			}
		case '"':
			return b.String()
		default:
			b.WriteByte(rest[i])
		}
	}
	return b.String()
}

// save reads a table with iptables-save.
func (c Commands) save(ctx context.Context, table string) (*savedTable, error) {
	out, err := exec.CommandContext(ctx, c.IPTablesSave, "-t", table).Output()
	if err != nil {
		return nil, fmt.Errorf("iptables-save -t %s: %w", table, err)
	}
	return parseSave(string(out)), nil
}

func parseSave(text string) *savedTable {
	t := &savedTable{}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			t.chains = append(t.chains, name)
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			t.rules = append(t.rules, savedRule{chain: chain, spec: spec})
		}
	}
	return t
}

// jump is a rule in a built-in chain that sends traffic to one of the agent's chains.
type jump struct {
	table, chain string
	match        []string // before the owner comment
	target       string
}

func jumps(n chainNames) []jump {
	newOnly := []string{"-m", "conntrack", "--ctstate", "NEW"}
	return []jump{
		{"nat", "PREROUTING", nil, n.services},
		{"nat", "OUTPUT", nil, n.services},
		{"nat", "POSTROUTING", nil, n.postrouting},
		{"filter", "INPUT", newOnly, n.filter},
		{"filter", "FORWARD", newOnly, n.filter},
		{"filter", "OUTPUT", newOnly, n.filter},
	}
}

func (j jump) spec(owner string) []string {
	return append(append(append([]string{}, j.match...), "-m", "comment", "--comment", owner), "-j", j.target)
}

// ensureJumps puts each jump first in its built-in chain unless it is there already (kube-proxy does the
// same): the agent's REJECTs and translations come before anything that would accept the packet.
func ensureJumps(ipt *iptables.IPTables, n chainNames, owner string) error {
	for _, j := range jumps(n) {
		spec := j.spec(owner)
		ok, err := ipt.Exists(j.table, j.chain, spec...)
		if err != nil {
			return fmt.Errorf("checking the %s %s jump: %w", j.table, j.chain, err)
		}
		if !ok {
			if err := ipt.Insert(j.table, j.chain, 1, spec...); err != nil {
				return fmt.Errorf("adding the %s %s jump: %w", j.table, j.chain, err)
			}
		}
	}
	return nil
}

// removeChains deletes, in one transaction per table, every chain doomed picks and every rule elsewhere that
// jumps to one of them.
func (c Commands) removeChains(ctx context.Context, doomed func(chain string) bool) error {
	for _, table := range tables {
		saved, err := c.save(ctx, table)
		if err != nil {
			return err
		}
		var text strings.Builder
		mine := map[string]bool{}
		for _, ch := range saved.chains {
			if doomed(ch) {
				mine[ch] = true
			}
		}
		if len(mine) == 0 {
			continue
		}
		fmt.Fprintf(&text, "*%s\n", table)
		for _, r := range saved.rules {
			if mine[r.target()] && !mine[r.chain] {
				fmt.Fprintf(&text, "-D %s %s\n", r.chain, r.spec)
			}
		}
		for ch := range mine {
			fmt.Fprintf(&text, ":%s - [0:0]\n", ch)
		}
		for ch := range mine {
			fmt.Fprintf(&text, "-X %s\n", ch)
		}
		text.WriteString("COMMIT\n")
		if err := c.restore(ctx, []byte(text.String())); err != nil {
			return fmt.Errorf("removing chains from %s: %w", table, err)
		}
	}
	return nil
}

// staleOwners finds the ids whose chains no live agent owns (see ownership.go); self is never stale.
func (c Commands) staleOwners(ctx context.Context, self string) (map[string]string, error) {
	seen := map[string]bool{}
	dirs := map[string]string{}
	for _, table := range tables {
		saved, err := c.save(ctx, table)
		if err != nil {
			return nil, err
		}
		for _, ch := range saved.chains {
			if id := chainOwnerID(ch); id != "" {
				seen[id] = true
			}
		}
		for _, r := range saved.rules {
			if id, dir, ok := ParseOwnerComment(r.comment()); ok {
				dirs[id] = dir
			}
		}
	}
	stale := map[string]string{}
	for id := range seen {
		dir, known := dirs[id]
		if id != self && (!known || !OwnerAlive(dir)) {
			stale[id] = dir
		}
	}
	return stale, nil
}

// RemoveStale removes the chains and jumps of every agent that is not alive (ownership.go), its pod egress
// masquerade chain included, and returns the ids of those agents with their data dirs ("" when no comment
// named one). self, the calling agent's id, is left alone; the caller holds its Claim.
func RemoveStale(ctx context.Context, cmds Commands, self string) (removed map[string]string, err error) {
	cmds = cmds.withDefaults()
	stale, err := cmds.staleOwners(ctx, self)
	if err != nil || len(stale) == 0 {
		return nil, err
	}
	return stale, cmds.removeChains(ctx, func(ch string) bool { _, ok := stale[chainOwnerID(ch)]; return ok })
}

// RemoveAll removes every chain and jump of the agent with this id, its pod egress masquerade included:
// `skiff agent -teardown`. It is idempotent, and a host without iptables has nothing to remove.
func RemoveAll(ctx context.Context, cmds Commands, id string) error {
	cmds = cmds.withDefaults()
	if _, err := exec.LookPath(cmds.IPTablesSave); err != nil {
		return nil
	}
	return cmds.removeChains(ctx, func(ch string) bool { return chainOwnerID(ch) == id })
}
