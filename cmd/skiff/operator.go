package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
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
	{[]string{"snapshot", "save"}, "FILE", exactly(1), snapshotSave},
	{[]string{"snapshot", "restore"}, "FILE", exactly(1), snapshotRestore},
	{[]string{"snapshot", "inspect"}, "FILE", exactly(1), snapshotInspect},
	{[]string{"members"}, "", exactly(0), listMembers},
}

func exactly(n int) func(int) bool { return func(got int) bool { return got == n } }

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
		if err := fs.Parse(args[len(c.words):]); err != nil {
			return 2
		}
		if !c.nargs(fs.NArg()) {
			fmt.Fprintf(os.Stderr, "usage: skiff operator %s [-kubeconfig FILE] %s\n", strings.Join(c.words, " "), c.args)
			return 2
		}
		var client *opClient
		if c.words[0] != "snapshot" || c.words[1] != "inspect" {
			var err error
			if client, err = newOpClient(*kubeconfig); err != nil {
				fmt.Fprintf(os.Stderr, "skiff operator: %v\n", err)
				return 1
			}
		}
		if err := c.run(client, fs.Args()); err != nil {
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
	var info fsm.SnapshotInfo
	if err := c.do("PUT", "/v1/operator/snapshot", f, &info); err != nil {
		return err
	}
	fmt.Printf("restored snapshot %s: revision %d, %d keys\n", args[0], info.Revision, info.Keys)
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
		rows = append(rows, []string{m.Name, m.Address, m.Status, m.Role, orDash(strings.Join(addrs, " ")), nodes})
	}
	table("NAME\tADDRESS\tSTATUS\tROLE\tSERVES\tNODES", rows)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
