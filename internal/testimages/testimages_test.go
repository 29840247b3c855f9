package testimages

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestPush(t *testing.T) {
	addr := StartRegistry(t)
	refs := Push(t, addr)
	b := build()
	for _, c := range []struct {
		ref        string
		img        v1.Image
		entrypoint []string
		cmd        []string
	}{
		{refs.Busybox, b.busybox, nil, []string{"sh"}},
		{refs.Server, b.server, []string{"/server"}, nil},
		{refs.Pause, b.pause, []string{"/pause"}, nil},
	} {
		if !strings.HasPrefix(c.ref, addr+"/skiff/") || !strings.HasSuffix(c.ref, ":test") {
			t.Errorf("ref %q", c.ref)
		}
		// Pull the manifest and config back over the distribution API.
		repo, tag, _ := strings.Cut(strings.TrimPrefix(c.ref, addr+"/"), ":")
		manifest := get(t, "http://"+addr+"/v2/"+repo+"/manifests/"+tag)
		want, err := c.img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if got := sha(manifest); got != want.String() {
			t.Errorf("%s: pulled digest %s, pushed %s", c.ref, got, want)
		}
		m, err := v1.ParseManifest(strings.NewReader(string(manifest)))
		if err != nil {
			t.Fatal(err)
		}
		var cf v1.ConfigFile
		if err := json.Unmarshal(get(t, "http://"+addr+"/v2/"+repo+"/blobs/"+m.Config.Digest.String()), &cf); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, c.entrypoint) || !slices.Equal(cf.Config.Cmd, c.cmd) {
			t.Errorf("%s: entrypoint %v, cmd %v", c.ref, cf.Config.Entrypoint, cf.Config.Cmd)
		}
	}

	// A second push (as another test would do) reuses the built images.
	if again := Push(t, addr); again != refs {
		t.Errorf("second push gave %+v", again)
	}
}

func TestImageContents(t *testing.T) {
	b := build()
	if b.err != nil {
		t.Fatal(b.err)
	}
	busybox := layerEntries(t, b.busybox)
	for name, typ := range map[string]byte{
		"bin/busybox": tar.TypeReg, "bin/sh": tar.TypeSymlink, "bin/sleep": tar.TypeSymlink,
		"bin/cat": tar.TypeSymlink, "bin/wget": tar.TypeSymlink, "bin/nc": tar.TypeSymlink,
		"etc/passwd": tar.TypeReg, "etc/group": tar.TypeReg, "tmp/": tar.TypeDir,
	} {
		if h, ok := busybox[name]; !ok || h.Typeflag != typ {
			t.Errorf("busybox image: %s missing or of type %q", name, h.Typeflag)
		}
	}
	server := layerEntries(t, b.server)
	for _, name := range []string{"server", "bin/busybox", "bin/sh", "bin/cat", "tmp/"} {
		if _, ok := server[name]; !ok {
			t.Errorf("server image: no %s", name)
		}
	}
	if pause := layerEntries(t, b.pause); len(pause) != 1 || pause["pause"] == nil || pause["pause"].Mode != 0o755 {
		t.Errorf("pause image entries: %v", pause)
	}
}

// layerEntries returns the headers of img's single layer, by name.
func layerEntries(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = h
	}
}

// proc is a process a test started; it is killed when the test ends.
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stdout string // the file its stdout goes to
	url    string // for the test server: http://127.0.0.1:PORT
}

// start runs binary (whose content is given) with args, in a temporary directory.
func start(t *testing.T, binary []byte, env []string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{}), stdout: filepath.Join(dir, "stdout")}
	out, err := os.Create(p.stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	p.cmd.Stdout, p.cmd.Stderr, p.cmd.Env = out, out, append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	return p
}

// startServer runs the test server on a free port and waits for its start line.
func startServer(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	b := build()
	if b.err != nil {
		t.Fatal(b.err)
	}
	p := start(t, b.serverBinary, env, append([]string{"-port", "0"}, args...)...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := os.ReadFile(p.stdout)
		line, _, complete := strings.Cut(string(out), "\n")
		if addr, ok := strings.CutPrefix(line, "testserver listening on "); ok && complete {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("start line %q: %v", line, err)
			}
			p.url = "http://127.0.0.1:" + port
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start line; output: %q", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits for p to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(10 * time.Second):
		t.Fatal("the process did not exit")
		return 0
	}
}

func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServerEndpoints(t *testing.T) {
	p := startServer(t, []string{"MESSAGE=hello"})
	host, _ := os.Hostname()
	if code, body := status(t, p.url+"/"); code != 200 || !strings.HasPrefix(body, "hostname="+host+"\nmessage=hello\nclient=127.0.0.1:") {
		t.Errorf("/ = %d %q", code, body)
	}
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, []byte("content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := status(t, p.url+"/file?path="+file); code != 200 || body != "content" {
		t.Errorf("/file = %d %q", code, body)
	}
	if code, _ := status(t, p.url+"/file?path="+file+".missing"); code != 404 {
		t.Errorf("/file of a missing file = %d", code)
	}

	if code, body := status(t, p.url+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	status(t, p.url+"/fail")
	if code, _ := status(t, p.url+"/healthz"); code != 500 {
		t.Errorf("/healthz after /fail = %d", code)
	}
	if code, _ := status(t, p.url+"/ready"); code != 200 {
		t.Errorf("/ready = %d", code)
	}
	status(t, p.url+"/unready")
	if code, _ := status(t, p.url+"/ready"); code != 503 {
		t.Errorf("/ready after /unready = %d", code)
	}

	if code, _ := status(t, p.url+"/exit?code=3"); code != 200 {
		t.Errorf("/exit = %d", code)
	}
	if code := p.wait(t); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
}

// TestServerClientEndpoints drives the client side against a second server: fetches that reach it, one
// that is refused, a load over one kept-alive connection, and a name lookup.
func TestServerClientEndpoints(t *testing.T) {
	client, target := startServer(t, nil), startServer(t, []string{"MESSAGE=target"})
	host, _ := os.Hostname()
	var sum struct {
		OK, Failed, NewConns int
		Errors               []string
		Backends             map[string]int
	}
	decode := func(url string, into any) {
		t.Helper()
		code, body := status(t, url)
		if code != 200 {
			t.Fatalf("%s: %d %s", url, code, body)
		}
		if err := json.Unmarshal([]byte(body), into); err != nil {
			t.Fatalf("%s: %v: %s", url, err, body)
		}
	}
	decode(client.url+"/fetch?n=5&url="+target.url+"/", &sum)
	if sum.OK != 5 || sum.Failed != 0 || sum.Backends[host] != 5 || sum.NewConns != 5 {
		t.Errorf("/fetch: %+v", sum)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	ln.Close()
	decode(client.url+"/fetch?n=1&url="+closed, &sum)
	if sum.OK != 0 || sum.Failed != 1 || len(sum.Errors) != 1 || !strings.Contains(sum.Errors[0], "connection refused") {
		t.Errorf("/fetch of a closed port: %+v", sum)
	}
	if code, body := status(t, client.url+"/load/start?rate=50&keepalive=1&url="+target.url+"/"); code != 200 {
		t.Fatalf("/load/start: %d %s", code, body)
	}
	time.Sleep(300 * time.Millisecond)
	decode(client.url+"/load/stop", &sum)
	if sum.OK < 5 || sum.Failed != 0 || sum.NewConns != 1 {
		t.Errorf("/load over one connection: %+v", sum)
	}
	var ans struct {
		Answers []string
		Error   string
	}
	decode(client.url+"/dns?name=localhost", &ans)
	if ans.Error != "" || len(ans.Answers) == 0 {
		t.Errorf("/dns localhost: %+v", ans)
	}
}

func TestServerSIGTERM(t *testing.T) {
	termFile := filepath.Join(t.TempDir(), "term")
	p := startServer(t, nil, "-term-file", termFile)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
	if b, err := os.ReadFile(termFile); err != nil || string(b) != "got SIGTERM\n" {
		t.Errorf("term file: %q, %v", b, err)
	}
	if out, _ := os.ReadFile(p.stdout); !strings.Contains(string(out), "got SIGTERM") {
		t.Errorf("stdout %q", out)
	}
}

func TestServerIgnoreSIGTERM(t *testing.T) {
	t.Setenv("PORT", "1") // -port overrides $PORT
	p := startServer(t, nil, "-ignore-sigterm")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		t.Fatal("exited on SIGTERM")
	case <-time.After(300 * time.Millisecond):
	}
	if code, _ := status(t, p.url+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}

func TestPauseStopsOnSIGTERM(t *testing.T) {
	b := build()
	if b.err != nil {
		t.Fatal(b.err)
	}
	p := start(t, b.pauseBinary, nil)
	// The Go runtime catches every signal from its start and, until main asks for SIGTERM, dies of it: nothing
	// outside tells when main has, so give it ample time (it does so first thing).
	time.Sleep(500 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v %s", url, resp.Status, err, b)
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}
