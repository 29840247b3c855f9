package nodeagent

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	refdocker "github.com/containerd/containerd/reference/docker"
	"github.com/containerd/containerd/remotes/docker"
	corev1 "k8s.io/api/core/v1"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/images"
)

// snapshotter is the containerd snapshotter the agent unpacks images with.
const snapshotter = "overlayfs"

// normalizeRef turns a Kubernetes image name ("busybox", "registry:5000/app") into a full reference
// ("docker.io/library/busybox:latest"), as the kubelet and containerd do.
func normalizeRef(image string) (string, error) {
	named, err := refdocker.ParseDockerRef(image)
	if err != nil {
		return "", fmt.Errorf("couldn't parse image name %q: %w", image, err)
	}
	return named.String(), nil
}

// registryHosts resolves a registry host to its endpoints: the configured `registry "host" {}` blocks
// first, then the host itself, over plain HTTP for loopback hosts (as Docker treats them) and HTTPS otherwise.
// creds supplies imagePullSecrets credentials for a host, when any.
func registryHosts(regs []config.Registry, creds func(host string) (string, string, error)) docker.RegistryHosts {
	byHost := map[string]config.Registry{}
	for _, r := range regs {
		byHost[r.Host] = r
	}
	return func(host string) ([]docker.RegistryHost, error) {
		reg, configured := byHost[host]
		endpoints := reg.Endpoints
		if len(endpoints) == 0 {
			endpoints = []string{host}
		}
		var out []docker.RegistryHost
		for _, ep := range endpoints {
			scheme, addr := "https", ep
			if i := strings.Index(ep, "://"); i >= 0 {
				scheme, addr = ep[:i], ep[i+3:]
			} else if reg.PlainHTTP || (!configured && docker.IsLocalhost(addr)) {
				scheme = "http"
			}
			if addr == "docker.io" {
				addr = "registry-1.docker.io"
			}
			transport := http.DefaultTransport.(*http.Transport).Clone()
			if reg.InsecureSkipVerify {
				transport.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the operator asked for it
			}
			client := &http.Client{Transport: transport}
			user, pass := reg.Username, reg.Password
			authCreds := func(h string) (string, string, error) {
				if user != "" {
					return user, pass, nil
				}
				if creds != nil {
					return creds(host)
				}
				return "", "", nil
			}
			out = append(out, docker.RegistryHost{
				Client: client, Host: addr, Scheme: scheme, Path: "/v2",
				Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve,
				Authorizer:   docker.NewDockerAuthorizer(docker.WithAuthClient(client), docker.WithAuthCreds(authCreds)),
			})
		}
		return out, nil
	}
}

// dockerConfig is the part of a kubernetes.io/dockerconfigjson (or dockercfg) secret the agent reads.
type dockerConfig struct {
	Auths map[string]struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Auth     string `json:"auth"`
	} `json:"auths"`
}

// pullSecretCreds reads a pod's imagePullSecrets into a credentials lookup by registry host.
func pullSecretCreds(ctx context.Context, pod *corev1.Pod, get objectGetter) func(host string) (string, string, error) {
	type cred struct{ user, pass string }
	found := map[string]cred{}
	for _, ref := range pod.Spec.ImagePullSecrets {
		secret, err := get.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			continue // the kubelet pulls without a missing pull secret, too
		}
		var cfg dockerConfig
		if raw, ok := secret.Data[corev1.DockerConfigJsonKey]; ok {
			_ = json.Unmarshal(raw, &cfg)
		} else if raw, ok := secret.Data[corev1.DockerConfigKey]; ok {
			_ = json.Unmarshal(raw, &cfg.Auths)
		}
		for host, a := range cfg.Auths {
			user, pass := a.Username, a.Password
			if a.Auth != "" {
				if dec, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
					user, pass, _ = strings.Cut(string(dec), ":")
				}
			}
			host = strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")
			host, _, _ = strings.Cut(host, "/")
			if host == "index.docker.io" || host == "registry-1.docker.io" {
				host = "docker.io" // Docker Hub's credentials are keyed by its old index address
			}
			if _, dup := found[host]; !dup {
				found[host] = cred{user, pass}
			}
		}
	}
	return func(host string) (string, string, error) {
		c := found[host]
		return c.user, c.pass, nil
	}
}

// pullOutcome is the container's waiting reason after an image step that did not produce an image.
type pullOutcome struct {
	reason, message string
	retryAfter      time.Duration
}

func (p *pullOutcome) Error() string { return p.reason + ": " + p.message }

// ensureImage makes the container's image present and unpacked, per its imagePullPolicy, with the kubelet's
// events (Pulling, Pulled, Failed, BackOff) and image pull backoff. A *pullOutcome error carries the waiting
// reason (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName).
func (r *containerdRuntime) ensureImage(ctx context.Context, pod *corev1.Pod, c *corev1.Container) (containerd.Image, error) {
	ref, err := normalizeRef(c.Image)
	if err != nil {
		r.event(pod, corev1.EventTypeWarning, "InspectFailed", "Failed to apply default image tag %q: %v", c.Image, err)
		return nil, &pullOutcome{reason: "InvalidImageName", message: err.Error()}
	}
	policy := c.ImagePullPolicy
	img, err := r.client.GetImage(ctx, ref)
	present := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, err
	}
	if present && policy != corev1.PullAlways {
		if err := r.unpack(ctx, img); err != nil {
			return nil, err
		}
		r.eventOnce(pod, c.Name+"/present/"+ref, corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.Image)
		return img, nil
	}
	if !present && policy == corev1.PullNever {
		msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)
		r.event(pod, corev1.EventTypeWarning, "ErrImageNeverPull", "%s", msg)
		return nil, &pullOutcome{reason: "ErrImageNeverPull", message: msg}
	}
	key := string(pod.UID) + "/" + c.Image
	if waiting, left := r.pullBackoff.inBackoff(key); waiting {
		r.event(pod, corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", c.Image)
		return nil, &pullOutcome{reason: "ImagePullBackOff", message: fmt.Sprintf("Back-off pulling image %q", c.Image), retryAfter: left}
	}
	r.event(pod, corev1.EventTypeNormal, "Pulling", "Pulling image %q", c.Image)
	start := time.Now()
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: registryHosts(r.cfg.Registries, pullSecretCreds(ctx, pod, r.objects))})
	img, err = r.client.Pull(ctx, ref, containerd.WithPullUnpack, containerd.WithResolver(resolver), containerd.WithPullSnapshotter(snapshotter))
	if err != nil {
		now := time.Now()
		until := r.pullBackoff.next(key, now, now)
		msg := fmt.Sprintf("Failed to pull image %q: %v", c.Image, err)
		r.event(pod, corev1.EventTypeWarning, "Failed", "%s", msg)
		r.event(pod, corev1.EventTypeWarning, "Failed", "Error: ErrImagePull")
		// Sync again halfway through the backoff, to show ImagePullBackOff for the rest of it, as the
		// kubelet's status moves from ErrImagePull to ImagePullBackOff.
		return nil, &pullOutcome{reason: "ErrImagePull", message: msg, retryAfter: time.Until(until) / 2}
	}
	r.pullBackoff.forget(key)
	took := time.Since(start).Round(time.Millisecond)
	size, _ := img.Size(ctx)
	r.event(pod, corev1.EventTypeNormal, "Pulled", "Successfully pulled image %q in %s (%s including waiting). Image size: %d bytes.", c.Image, took, took, size)
	return img, nil
}

func (r *containerdRuntime) unpack(ctx context.Context, img containerd.Image) error {
	ok, err := img.IsUnpacked(ctx, snapshotter)
	if err != nil || ok {
		return err
	}
	return img.Unpack(ctx, snapshotter)
}

// builtinPauseRef names the pause image the agent builds itself from the skiff-pause binary.
const builtinPauseRef = "skiff.local/pause:1"

// ensurePauseImage makes the sandbox image available: a configured pause_image is pulled like any image;
// otherwise the agent builds its own from the skiff-pause binary installed next to the skiff binary, so that
// a node needs no registry to run pods.
func (r *containerdRuntime) ensurePauseImage(ctx context.Context) (containerd.Image, error) {
	r.pauseMu.Lock() // pod workers start sandboxes at once; one of them builds the image
	defer r.pauseMu.Unlock()
	if r.cfg.PauseImage != "" {
		ref, err := normalizeRef(r.cfg.PauseImage)
		if err != nil {
			return nil, err
		}
		if img, err := r.client.GetImage(ctx, ref); err == nil {
			return img, r.unpack(ctx, img)
		}
		resolver := docker.NewResolver(docker.ResolverOptions{Hosts: registryHosts(r.cfg.Registries, nil)})
		return r.client.Pull(ctx, ref, containerd.WithPullUnpack, containerd.WithResolver(resolver), containerd.WithPullSnapshotter(snapshotter))
	}
	if img, err := r.client.GetImage(ctx, builtinPauseRef); err == nil {
		return img, r.unpack(ctx, img)
	}
	bin, err := pauseBinary()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	built, err := images.Build(images.PauseImage(data))
	if err != nil {
		return nil, err
	}
	tarPath := filepath.Join(r.cfg.DataDir, "pause.tar")
	if err := images.WriteTarball(built, builtinPauseRef, tarPath); err != nil {
		return nil, err
	}
	defer os.Remove(tarPath)
	if err := r.importTarball(ctx, tarPath); err != nil {
		return nil, err
	}
	img, err := r.client.GetImage(ctx, builtinPauseRef)
	if err != nil {
		return nil, fmt.Errorf("the imported pause image is missing: %w", err)
	}
	return img, r.unpack(ctx, img)
}

// pauseBinary finds skiff-pause: $SKIFF_PAUSE_BINARY, next to the running executable, or on PATH.
func pauseBinary() (string, error) {
	if p := os.Getenv("SKIFF_PAUSE_BINARY"); p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "skiff-pause")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("skiff-pause"); err == nil {
		return p, nil
	}
	return "", errors.New("skiff-pause not found next to the skiff binary or on PATH (make build produces bin/skiff-pause); or set agent.pause_image")
}

// importTarball imports an OCI or docker-archive tarball into containerd and unpacks its images.
func (r *containerdRuntime) importTarball(ctx context.Context, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	imgs, err := r.client.Import(ctx, f)
	if err != nil {
		return fmt.Errorf("importing %s: %w", path, err)
	}
	for _, rec := range imgs {
		if err := r.unpack(ctx, containerd.NewImage(r.client, rec)); err != nil {
			return fmt.Errorf("unpacking %s from %s: %w", rec.Name, path, err)
		}
	}
	return nil
}

// importAirGapImages imports every tarball in <data_dir>/images/, as k3s does for air-gapped nodes.
func (r *containerdRuntime) importAirGapImages(ctx context.Context) error {
	entries, err := os.ReadDir(filepath.Join(r.cfg.DataDir, "images"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		if err := r.importTarball(ctx, filepath.Join(r.cfg.DataDir, "images", e.Name())); err != nil {
			return err
		}
		r.logger.Info("imported image tarball", "file", e.Name())
	}
	return nil
}

// Images lists the images in the agent's containerd namespace for the Node's status.images: names (tag and
// repo@digest forms, as the kubelet reports them) and sizes, largest first, at most maxNodeImages.
func (r *containerdRuntime) Images(ctx context.Context) ([]corev1.ContainerImage, error) {
	ctx = r.ctx(ctx)
	list, err := r.client.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	byDigest := map[string]*corev1.ContainerImage{}
	var out []*corev1.ContainerImage
	for _, img := range list {
		digest := img.Target().Digest.String()
		entry := byDigest[digest]
		if entry == nil {
			size, _ := img.Size(ctx)
			entry = &corev1.ContainerImage{SizeBytes: size}
			byDigest[digest] = entry
			out = append(out, entry)
		}
		entry.Names = append(entry.Names, imageID(img), img.Name())
	}
	result := make([]corev1.ContainerImage, 0, len(out))
	for _, e := range out {
		sort.Strings(e.Names)
		e.Names = slices.Compact(e.Names)
		result = append(result, *e)
	}
	sort.SliceStable(result, func(i, j int) bool {
		if result[i].SizeBytes != result[j].SizeBytes {
			return result[i].SizeBytes > result[j].SizeBytes
		}
		return result[i].Names[0] < result[j].Names[0]
	})
	if len(result) > maxNodeImages {
		result = result[:maxNodeImages]
	}
	return result, nil
}
