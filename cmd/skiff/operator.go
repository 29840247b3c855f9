package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/server"
)

// operatorCommands is the table of `skiff operator` subcommands: path words, argument usage, and the action.
var operatorCommands = []struct {
	words []string
	args  string
	nargs func(int) bool
	run   func(c *opClient, args []string) error
}{
	{[]string{"raft", "list-peers"}, "", exactly(0), listPeers},
	{[]string{"raft", "remove-peer"}, "NAME", exactly(1), removePeer},
	{[]string{"raft", "transfer-leadership"}, "[NAME]", func(n int) bool { return n <= 1 }, transferLeadership},
	{[]string{"raft", "recover"}, "SERVER.HCL", exactly(1), raftRecover},
	{[]string{"snapshot", "save"}, "FILE", exactly(1), snapshotSave},
	{[]string{"snapshot", "restore"}, "FILE", exactly(1), snapshotRestore},
	{[]string{"snapshot", "inspect"}, "FILE", exactly(1), snapshotInspect},
	{[]string{"members"}, "", exactly(0), listMembers},
	{[]string{"gossip", "keyring"}, "-list | -install KEY | -use KEY | -remove KEY", func(n int) bool { return n == 1 || n == 2 }, gossipKeyring},
	{[]string{"health"}, "", exactly(0), health},
	{[]string{"debug"}, "[-output FILE.tar.gz] [-profile 30s]", exactly(2), debugBundle},
	{[]string{"token", "rotate"}, "[TOKEN]", func(n int) bool { return n <= 1 }, rotateJoinToken},
	{[]string{"secrets-encrypt", "status"}, "", exactly(0), secretsEncryptStatus},
	{[]string{"secrets-encrypt", "rotate"}, "", exactly(0), secretsEncryptRotate},
}

// offlineCommands work on files on this host, without a server to talk to.
var offlineCommands = map[string]bool{"snapshot inspect": true, "raft recover": true}

func exactly(n int) func(int) bool { return func(got int) bool { return got == n } }

// operatorFlags declares the flags of the commands that take more than -kubeconfig, by command words; what
// each returns turns the parsed flags and the remaining arguments into the command's arguments.
var operatorFlags = map[string]func(fs *flag.FlagSet) func(rest []string) ([]string, error){
	"gossip keyring": keyringFlags,
	"debug":          debugFlags,
}

func operatorUsage() {
	fmt.Fprintln(os.Stderr, "usage: skiff operator <command> [-kubeconfig FILE] [args]\n\ncommands:")
	for _, c := range operatorCommands {
		fmt.Fprintf(os.Stderr, "  %s %s\n", strings.Join(c.words, " "), c.args)
	}
}

func runOperator(args []string) int {
	for _, c := range operatorCommands {
		if len(args) < len(c.words) || strings.Join(args[:len(c.words)], " ") != strings.Join(c.words, " ") {
			continue
		}
		fs := flag.NewFlagSet("operator "+strings.Join(c.words, " "), flag.ContinueOnError)
		kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig that names and authenticates to a server (default $KUBECONFIG)")
		toArgs := func(rest []string) ([]string, error) { return rest, nil }
		if declare := operatorFlags[strings.Join(c.words, " ")]; declare != nil {
			toArgs = declare(fs)
		}
		if err := fs.Parse(args[len(c.words):]); err != nil {
			return 2
		}
		cmdArgs, err := toArgs(fs.Args())
		if err != nil || !c.nargs(len(cmdArgs)) {
			if err != nil {
				fmt.Fprintf(os.Stderr, "skiff operator %s: %v\n", strings.Join(c.words, " "), err)
			}
			fmt.Fprintf(os.Stderr, "usage: skiff operator %s [-kubeconfig FILE] %s\n", strings.Join(c.words, " "), c.args)
			return 2
		}
		var client *opClient
		if !offlineCommands[strings.Join(c.words, " ")] {
			var err error
			if client, err = newOpClient(*kubeconfig); err != nil {
				fmt.Fprintf(os.Stderr, "skiff operator: %v\n", err)
				return 1
			}
		}
		if err := c.run(client, cmdArgs); err != nil {
			fmt.Fprintf(os.Stderr, "skiff operator: %v\n", err)
			return 1
		}
		return 0
	}
	operatorUsage()
	return 2
}

// opClient talks to one server's operator endpoints, as named and authenticated by a kubeconfig.
type opClient struct {
	base string
	http *http.Client
}

func newOpClient(kubeconfig string) (*opClient, error) {
	if kubeconfig == "" {
		return nil, errors.New("no kubeconfig: pass -kubeconfig or set KUBECONFIG (servers write <data_dir>/admin.kubeconfig)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.Timeout = 2 * time.Minute
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &opClient{base: strings.TrimSuffix(cfg.Host, "/"), http: hc}, nil
}

// do sends a request and decodes a JSON answer into out (when not nil). A non-2xx answer becomes an error
// carrying the server's Status message.
func (c *opClient) do(method, path string, body io.Reader, out any) error {
	resp, err := c.send(method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *opClient) send(method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var st struct{ Message string }
		data, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(data, &st) != nil || st.Message == "" {
			st.Message = strings.TrimSpace(string(data))
		}
		return nil, fmt.Errorf("%s (HTTP %d)", st.Message, resp.StatusCode)
	}
	return resp, nil
}

func table(header string, rows [][]string) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
	fmt.Fprintln(w, header)
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

func listPeers(c *opClient, _ []string) error {
	var peers []server.PeerInfo
	if err := c.do("GET", "/v1/operator/raft/peers", nil, &peers); err != nil {
		return err
	}
	var rows [][]string
	for _, p := range peers {
		rows = append(rows, []string{p.Name, p.ID, p.Address, p.State, fmt.Sprint(p.Voter)})
	}
	table("NAME\tID\tADDRESS\tSTATE\tVOTER", rows)
	return nil
}

func removePeer(c *opClient, args []string) error {
	if err := c.do("DELETE", "/v1/operator/raft/peers/"+url.PathEscape(args[0]), nil, nil); err != nil {
		return err
	}
	fmt.Printf("removed peer %s\n", args[0])
	return nil
}

func transferLeadership(c *opClient, args []string) error {
	q := ""
	if len(args) == 1 {
		q = "?to=" + url.QueryEscape(args[0])
	}
	var out struct{ Leader string }
	if err := c.do("POST", "/v1/operator/raft/transfer-leadership"+q, nil, &out); err != nil {
		return err
	}
	fmt.Println("leadership transferred")
	return nil
}

// health prints the cluster's health as the leader sees it; it fails (exit code 1) unless the cluster is
// healthy, so it can serve as a probe.
func health(c *opClient, _ []string) error {
	var h server.Health
	if err := c.do("GET", "/v1/operator/health", nil, &h); err != nil {
		return err
	}
	fmt.Printf("leader: %s\nhealthy: %v\nfailure tolerance: %d\n\n", orDash(h.Leader), h.Healthy, h.FailureTolerance)
	var rows [][]string
	for _, sv := range h.Servers {
		contact := "-"
		if sv.LastContactMillis >= 0 {
			contact = fmt.Sprintf("%dms", sv.LastContactMillis)
		}
		rows = append(rows, []string{sv.Name, sv.Address, fmt.Sprint(sv.Voter), fmt.Sprint(sv.Leader), sv.Gossip, contact,
			fmt.Sprint(sv.AppliedIndex), fmt.Sprint(sv.AppliedLag), fmt.Sprint(sv.Healthy), orDash(sv.Reason)})
	}
	table("SERVER\tADDRESS\tVOTER\tLEADER\tGOSSIP\tLAST CONTACT\tAPPLIED\tLAG\tHEALTHY\tREASON", rows)
	if len(h.Agents) > 0 {
		fmt.Println()
		rows = nil
		for _, a := range h.Agents {
			rows = append(rows, []string{a.Name, a.State, fmt.Sprint(a.Nodes)})
		}
		table("AGENT\tSTATE\tNODES", rows)
	}
	if !h.Healthy {
		return errors.New("the cluster is not healthy")
	}
	return nil
}

// rotateJoinToken replaces the agents' join token (a given one, or one the server draws) and prints it.
func rotateJoinToken(c *opClient, args []string) error {
	var req server.JoinTokenRotation
	if len(args) == 1 {
		req.Token = args[0]
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var out server.JoinTokenRotation
	if err := c.do("POST", "/v1/operator/join-token/rotate", strings.NewReader(string(body)), &out); err != nil {
		return err
	}
	fmt.Println(out.Token)
	return nil
}

func snapshotSave(c *opClient, args []string) error {
	resp, err := c.send("GET", "/v1/operator/snapshot", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	tmp := args[0] + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	_, err = io.Copy(f, resp.Body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// Verify what arrived before calling it saved.
	info, err := inspectFile(tmp)
	if err != nil {
		return fmt.Errorf("downloaded snapshot does not verify: %w", err)
	}
	if err := os.Rename(tmp, args[0]); err != nil {
		return err
	}
	fmt.Printf("saved snapshot %s: revision %d, %d keys, %d bytes\n", args[0], info.Revision, info.Keys, info.Bytes)
	return nil
}

func snapshotRestore(c *opClient, args []string) error {
	if _, err := inspectFile(args[0]); err != nil {
		return err
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	var res server.RestoreResult
	if err := c.do("PUT", "/v1/operator/snapshot", f, &res); err != nil {
		return err
	}
	fmt.Printf("restored snapshot %s: revision %d, %d keys\n", args[0], res.Revision, res.Keys)
	if res.IdentityChanged {
		fmt.Print("The snapshot comes from another cluster: its CA, tokens and service account key replace this cluster's.\n" +
			"Now restart each server, one at a time, so that it serves with them; the admin kubeconfigs the servers\n" +
			"write then work, and so do the old cluster's. Point the agents at the servers (docs/operations.md).\n")
	}
	return nil
}

func inspectFile(path string) (fsm.SnapshotInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return fsm.SnapshotInfo{}, err
	}
	defer f.Close()
	return fsm.InspectSnapshot(f)
}

func snapshotInspect(_ *opClient, args []string) error {
	info, err := inspectFile(args[0])
	if err != nil {
		return err
	}
	table("FIELD\tVALUE", [][]string{
		{"Format", fmt.Sprint(info.Version)}, {"Revision", fmt.Sprint(info.Revision)},
		{"Applied index", fmt.Sprint(info.Applied)}, {"Keys", fmt.Sprint(info.Keys)},
		{"Size", fmt.Sprintf("%d bytes", info.Bytes)}, {"SHA-256", info.SHA256},
	})
	fmt.Println()
	var rows [][]string
	for _, p := range info.Prefixes {
		rows = append(rows, []string{p.Prefix, fmt.Sprint(p.Keys)})
	}
	table("PREFIX\tKEYS", rows)
	return nil
}

func listMembers(c *opClient, _ []string) error {
	var members []server.MemberInfo
	if err := c.do("GET", "/v1/operator/members", nil, &members); err != nil {
		return err
	}
	var rows [][]string
	for _, m := range members {
		addrs := []string{}
		if m.API != "" {
			addrs = append(addrs, "api="+m.API)
		}
		if m.Raft != "" {
			addrs = append(addrs, "raft="+m.Raft)
		}
		nodes := "-"
		if len(m.Nodes) > 0 {
			nodes = strings.Join(m.Nodes, ",")
		}
		rows = append(rows, []string{m.Name, m.Address, m.Status, m.Role, orDash(strings.Join(addrs, " ")), nodes, orDash(m.Version)})
	}
	table("NAME\tADDRESS\tSTATUS\tROLE\tSERVES\tNODES\tVERSION", rows)
	return nil
}

// keyringFlags are the flags of `gossip keyring`: exactly one of -list, -install KEY, -use KEY, -remove KEY,
// which become the arguments ["list"] or [action, KEY].
func keyringFlags(fs *flag.FlagSet) func(rest []string) ([]string, error) {
	fs.Bool("list", false, "list the cluster's gossip keys, the primary marked, and how many members have applied the keyring")
	fs.String("install", "", "install a key (base64 of 16, 24 or 32 bytes, e.g. from `head -c32 /dev/urandom | base64`) on every member")
	fs.String("use", "", "make an installed key the primary key, the one members encrypt with")
	fs.String("remove", "", "remove a key that is not the primary key")
	return func(rest []string) ([]string, error) {
		var set []*flag.Flag
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "kubeconfig" {
				set = append(set, f)
			}
		})
		if len(set) != 1 || len(rest) > 0 {
			return nil, errors.New("give exactly one of -list, -install KEY, -use KEY, -remove KEY")
		}
		if f := set[0]; f.Name != "list" {
			return []string{f.Name, f.Value.String()}, nil
		} else if f.Value.String() != "true" {
			return nil, errors.New("-list takes no value")
		}
		return []string{"list"}, nil
	}
}

// gossipKeyring lists the cluster's gossip keyring or changes it (install, use or remove a key), and says
// what changed.
func gossipKeyring(c *opClient, args []string) error {
	if args[0] == "list" {
		var ring server.GossipKeyring
		if err := c.do("GET", "/v1/operator/gossip/keyring", nil, &ring); err != nil {
			return err
		}
		var rows [][]string
		for _, k := range ring.Keys {
			primary := ""
			if k == ring.Primary {
				primary = "primary"
			}
			rows = append(rows, []string{k, primary})
		}
		table("KEY\tPRIMARY", rows)
		fmt.Println()
		for _, p := range []struct {
			role string
			server.KeyringProgress
		}{{"servers", ring.Servers}, {"agents", ring.Agents}} {
			line := fmt.Sprintf("%-8s %d of %d alive have applied this keyring (%s)", p.role+":", p.Applied, p.Alive, ring.Hash)
			if len(p.Pending) > 0 {
				line += "; not yet: " + strings.Join(p.Pending, ", ")
				if more := p.Alive - p.Applied - len(p.Pending); more > 0 {
					line += fmt.Sprintf(" and %d more", more)
				}
			}
			fmt.Println(line)
		}
		return nil
	}
	body, err := json.Marshal(server.GossipKeyRequest{Key: args[1]})
	if err != nil {
		return err
	}
	var change server.GossipKeyringChange
	if err := c.do("POST", "/v1/operator/gossip/keyring/"+args[0], bytes.NewReader(body), &change); err != nil {
		return err
	}
	fmt.Println(change.Message)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func secretsEncryptStatus(c *opClient, _ []string) error {
	var rep server.EncryptionReport
	if err := c.do("GET", "/v1/operator/secrets-encrypt", nil, &rep); err != nil {
		return err
	}
	var rows [][]string
	for _, st := range rep.Servers {
		keys := strings.Join(st.Keys, ", ")
		if st.Err != "" {
			keys = "error: " + st.Err
		}
		rows = append(rows, []string{st.Server, st.Mode, keys})
	}
	table("SERVER\tMODE\tKEYS (THE FIRST WRITES)", rows)
	fmt.Println()
	rows = nil
	for _, key := range slices.Sorted(maps.Keys(rep.Stored)) {
		rows = append(rows, []string{key, fmt.Sprint(rep.Stored[key])})
	}
	table("WRITTEN WITH\tSECRETS", rows)
	return nil
}

func secretsEncryptRotate(c *opClient, _ []string) error {
	var res server.RotationResult
	if err := c.do("POST", "/v1/operator/secrets-encrypt/rotate", nil, &res); err != nil {
		return err
	}
	fmt.Printf("rotated to key %s on %s; %d secrets rewritten with it, and the old keys removed\n", res.Key, strings.Join(res.Servers, ", "), res.Rewritten)
	return nil
}
