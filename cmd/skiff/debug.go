package main

import (
	"archive/tar"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// debugFiles are what `skiff operator debug` asks the server for, and the file each answer becomes in the
// bundle. Leader-only endpoints (health) answer through any server, which forwards them.
var debugFiles = []struct{ path, file string }{
	{"/v1/operator/health", "health.json"},
	{"/v1/operator/raft/peers", "raft-peers.json"},
	{"/v1/operator/raft/state", "raft-state.json"},
	{"/v1/operator/members", "members.json"},
	{"/v1/operator/debug/logs", "server.log"},
	{"/metrics", "metrics.txt"},
	{"/version", "version.json"},
	{"/debug/pprof/goroutine?debug=2", "goroutines.txt"},
	{"/debug/pprof/heap", "heap.pprof"},
}

func debugFlags(fs *flag.FlagSet) func(rest []string) ([]string, error) {
	output := fs.String("output", "", "the bundle to write (default skiff-debug-<server time>.tar.gz)")
	profile := fs.Duration("profile", 0, "also take a CPU profile over this long (e.g. 30s)")
	return func(rest []string) ([]string, error) {
		if len(rest) != 0 {
			return nil, fmt.Errorf("unexpected arguments %v", rest)
		}
		return []string{*output, profile.String()}, nil
	}
}

// debugBundle writes a tar.gz of the server's state for a bug report: its health and Raft view, gossip
// members, recent log lines, metrics, version, goroutine dump and heap profile (and a CPU profile with
// -profile). A part the server cannot give is recorded in errors.txt, and the rest is still written.
func debugBundle(c *opClient, args []string) error {
	output, profile := args[0], args[1]
	if output == "" {
		output = fmt.Sprintf("skiff-debug-%s.tar.gz", time.Now().UTC().Format("20060102T150405Z"))
	}
	files := debugFiles
	if d, err := time.ParseDuration(profile); err == nil && d > 0 {
		files = append(files, struct{ path, file string }{fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())), "cpu.pprof"})
	}
	f, err := os.OpenFile(output, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	var problems []byte
	for _, part := range files {
		data, err := c.get(part.path)
		if err != nil {
			problems = fmt.Appendf(problems, "%s: %v\n", part.path, err)
			continue
		}
		if err := add(part.file, data); err != nil {
			f.Close()
			return err
		}
	}
	if len(problems) > 0 {
		if err := add("errors.txt", problems); err != nil {
			f.Close()
			return err
		}
	}
	for _, closer := range []io.Closer{tw, gz, f} {
		if err := closer.Close(); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %s (%d parts", output, len(files))
	if len(problems) > 0 {
		fmt.Printf("; some could not be read, see errors.txt in it")
	}
	fmt.Println(")")
	return nil
}

// get reads a path's whole answer.
func (c *opClient) get(path string) ([]byte, error) {
	resp, err := c.send("GET", path, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
