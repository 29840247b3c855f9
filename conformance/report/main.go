// Command report merges the JUnit reports of a conformance run's parts (the parallel run and the [Serial]
// run) into one junit_01.xml, as sonobuoy leaves it, and prints "N passed, M failed" with the failed tests.
// It exits 1 when a test failed or none ran.
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
)

// testSuites is the part of a ginkgo JUnit report this command reads and writes.
type testSuites struct {
	XMLName  xml.Name    `xml:"testsuites"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Disabled int         `xml:"disabled,attr"`
	Time     float64     `xml:"time,attr"`
	Suites   []testSuite `xml:"testsuite"`
}

type testSuite struct {
	Name     string     `xml:"name,attr"`
	Tests    int        `xml:"tests,attr"`
	Failures int        `xml:"failures,attr"`
	Errors   int        `xml:"errors,attr"`
	Skipped  int        `xml:"skipped,attr"`
	Time     float64    `xml:"time,attr"`
	Cases    []testCase `xml:"testcase"`
}

type testCase struct {
	Name      string    `xml:"name,attr"`
	Classname string    `xml:"classname,attr"`
	Status    string    `xml:"status,attr"`
	Time      float64   `xml:"time,attr"`
	Skipped   *message  `xml:"skipped"`
	Failure   *message  `xml:"failure"`
	Error     *message  `xml:"error"`
	SystemErr *textOnly `xml:"system-err"`
}

type message struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

type textOnly struct {
	Text string `xml:",chardata"`
}

func main() {
	out := flag.String("out", "junit_01.xml", "the merged report to write")
	flag.Parse()
	merged := testSuites{}
	var passed, failed []string
	for _, path := range flag.Args() {
		data, err := os.ReadFile(path)
		if err != nil {
			log.Fatal(err)
		}
		var ts testSuites
		if err := xml.Unmarshal(data, &ts); err != nil {
			log.Fatalf("%s: %v", path, err)
		}
		for _, s := range ts.Suites {
			for _, c := range s.Cases {
				bad := c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked" ||
					c.Status == "timedout" || c.Status == "aborted" || c.Status == "interrupted"
				switch {
				case bad:
					failed = append(failed, c.Name) // a test, or a suite node such as [SynchronizedBeforeSuite]
				case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
				case strings.HasPrefix(c.Name, "[It] "):
					passed = append(passed, c.Name)
				}
			}
			merged.Suites = append(merged.Suites, s)
			merged.Tests += s.Tests
			merged.Failures += s.Failures
			merged.Errors += s.Errors
			merged.Disabled += s.Skipped
			merged.Time += s.Time
		}
	}
	data, err := xml.MarshalIndent(merged, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, append([]byte(xml.Header), data...), 0o644); err != nil {
		log.Fatal(err)
	}
	sort.Strings(failed)
	for _, f := range failed {
		fmt.Println("FAILED:", f)
	}
	fmt.Printf("%d passed, %d failed\n", len(passed), len(failed))
	if len(failed) > 0 || len(passed) == 0 {
		os.Exit(1)
	}
}
