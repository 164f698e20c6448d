/* GPU topology descriptions (common/topology.h): good files in every form, a table of bad ones
 * whose one-line errors name the file, line and key, the writer read back, the ranks' view when
 * ranks share GPUs, NUMA nodes and switches from a fake sysfs tree, and [runtime] topology in
 * job.ini. */
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "common/topology.h"

static char dir[1024];

static int parse_text(const char *text, struct topology *t)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/host.ini", dir);
    tu_write_file(p, text);
    return topology_load(p, t);
}

static int make_dir(void **state)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "topology"));
    return 0;
}

static void test_good_files(void **state)
{
    struct topology t;
    assert_int_equal(parse_text("; a PCIe host\n"
                                "[gpus]\n"
                                "count = 4   ; four of them\n"
                                "bus = 0000:19:00.0 0000:1a:00.0 - 0000:9b:00.0\n"
                                "numa = 0 0 1 -1\n"
                                "switch = 0 0 1 2\n"
                                "memory = 81559 81559 -1 143771\n"
                                "p2p = 0-1 2-3 3-1\n"
                                "nvlink = 1-0\n",
                                &t),
                     0);
    assert_int_equal(t.gpus, 4);
    assert_int_equal(t.source, TOPO_FILE);
    assert_string_equal(t.bus_id[1], "0000:1a:00.0");
    assert_string_equal(t.bus_id[2], "");
    assert_int_equal(t.numa[2], 1);
    assert_int_equal(t.numa[3], -1);
    assert_int_equal(t.pcie_switch[3], 2);
    assert_int_equal(t.memory_mib[0], 81559);
    assert_int_equal(t.memory_mib[2], -1);
    assert_int_equal(t.memory_mib[3], 143771);
    assert_int_equal(topology_min_memory(&t), -1); /* one GPU's memory is unknown */
    /* pairs are symmetric; a GPU is not its own peer */
    assert_true(topology_p2p(&t, 0, 1) && topology_p2p(&t, 1, 0) && topology_p2p(&t, 1, 3) && topology_p2p(&t, 3, 2));
    assert_false(topology_p2p(&t, 0, 2) || topology_p2p(&t, 0, 0) || topology_p2p(&t, 0, 3));
    assert_true(topology_nvlink(&t, 0, 1) && topology_nvlink(&t, 1, 0));
    assert_false(topology_nvlink(&t, 2, 3));
    int a = -1, b = -1;
    assert_false(topology_all_p2p(&t, &a, &b));
    assert_int_equal(a, 0);
    assert_int_equal(b, 2);
    char line[512];
    topology_describe_gpu(&t, 1, line, sizeof line);
    assert_string_equal(line, "GPU 1 bus 0000:1a:00.0 NUMA 0 switch 0 P2P with 0,3, NVLink with 0");
    topology_describe_gpu(&t, 2, line, sizeof line);
    assert_string_equal(line, "GPU 2 bus ? NUMA 1 switch 1 P2P with 3");

    /* only count and p2p are needed; the rest is unknown */
    assert_int_equal(parse_text("[gpus]\ncount = 3\np2p = all\n", &t), 0);
    assert_true(topology_all_p2p(&t, &a, &b));
    assert_int_equal(t.numa[2], -1);
    assert_int_equal(t.pcie_switch[0], -1);
    assert_int_equal(t.memory_mib[1], -1);
    assert_int_equal(topology_min_memory(&t), -1);
    assert_int_equal(parse_text("[gpus]\ncount = 2\nmemory = 143771 81559\np2p = all\n", &t), 0);
    assert_int_equal(topology_min_memory(&t), (int64_t)81559 << 20); /* the smaller GPU bounds a plan */
    assert_int_equal(parse_text("[gpus]\np2p = none\ncount = 2\n", &t), 0);
    assert_false(topology_p2p(&t, 0, 1));

    /* what the writer prints reads back the same, in each p2p form */
    const char *forms[] = {"all", "none", "0-2 1-3"};
    for (int f = 0; f < 3; f++) {
        char text[512];
        snprintf(text, sizeof text, "[gpus]\ncount = 4\nbus = 0000:19:00.0 - - 0000:9b:00.0\nnuma = 0 0 1 1\n"
                                    "switch = 3 3 4 -1\nmemory = 81559 -1 81559 81559\np2p = %s\n", forms[f]);
        assert_int_equal(parse_text(text, &t), 0);
        char written[1200];
        snprintf(written, sizeof written, "%s/written.ini", dir);
        FILE *out = fopen(written, "w");
        topology_write(out, &t);
        fclose(out);
        char *back = tu_read_file(written, NULL);
        printf("# p2p = %s written as:\n%s", forms[f], back);
        assert_non_null(strstr(back, forms[f]));
        free(back);
        struct topology again;
        assert_int_equal(topology_load(written, &again), 0);
        assert_memory_equal(&again, &t, sizeof t);
    }
}

struct bad_topology {
    const char *text;
    const char *expect; /* the whole message after the file name */
};

static void test_bad_files(void **state)
{
    static const struct bad_topology cases[] = {
        {"[gpus]\ncount = 2\nthis is not a key\n", ":3: malformed line (expected [gpus], key = value, or a ; comment)"},
        {"[gpu]\ncount = 2\n", ":2: [gpu] count: unknown section; accepted: [gpus]"},
        {"count = 2\n", ":1: [(none)] count: unknown section; accepted: [gpus]"},
        {"[gpus]\ncount = 2\nlinks = all\n",
         ":3: [gpus] links: unknown key; accepted in [gpus]: count, bus, numa, switch, memory, p2p, nvlink"},
        {"[gpus]\ncount = 2\nmemory = 81559 0\np2p = all\n",
         ":3: [gpus] memory: GPU 1 has 0 MiB (MiB of device memory, -1 for unknown)"},
        {"[gpus]\ncount = 2\nmemory = 80G 80G\np2p = all\n",
         ":3: [gpus] memory: '80G' is not an integer >= -1 (-1: unknown)"},
        {"[gpus]\ncount = 2\np2p = all\ncount = 3\n", ":4: [gpus] count: set twice (first at line 2)"},
        {"[gpus]\np2p = all\n", ": [gpus] count: missing (the number of GPUs)"},
        {"[gpus]\ncount = 0\np2p = all\n", ":2: [gpus] count: '0' is not an integer in [1, 64]"},
        {"[gpus]\ncount = 65\np2p = all\n", ":2: [gpus] count: '65' is not an integer in [1, 64]"},
        {"[gpus]\ncount = four\np2p = all\n", ":2: [gpus] count: 'four' is not an integer in [1, 64]"},
        {"[gpus]\ncount = 2\n", ": [gpus] p2p: missing (all, none, or pairs like 0-1 2-3)"},
        {"[gpus]\ncount = 4\nnuma = 0 0 1\np2p = all\n", ":3: [gpus] numa: 3 value(s) for 4 GPU(s)"},
        {"[gpus]\ncount = 2\nnuma = 0 x\np2p = all\n", ":3: [gpus] numa: 'x' is not an integer >= -1 (-1: unknown)"},
        {"[gpus]\ncount = 2\nswitch = 0 -2\np2p = all\n",
         ":3: [gpus] switch: '-2' is not an integer >= -1 (-1: unknown)"},
        {"[gpus]\ncount = 2\nbus = 0000:19:00.0\np2p = all\n", ":3: [gpus] bus: 1 value(s) for 2 GPU(s)"},
        {"[gpus]\ncount = 1\nbus = 0000:19:00.0.0.0.0.0.0\np2p = all\n",
         ":3: [gpus] bus: '0000:19:00.0.0.0.0.0.0' is longer than a PCI bus id"},
        {"[gpus]\ncount = 4\np2p = 0:1\n", ":3: [gpus] p2p: '0:1' is not a pair i-j; accepted: all, none, or pairs like 0-1 2-3"},
        {"[gpus]\ncount = 4\np2p = some\n",
         ":3: [gpus] p2p: 'some' is not a pair i-j; accepted: all, none, or pairs like 0-1 2-3"},
        {"[gpus]\ncount = 4\np2p = 0-1 2-4\n", ":3: [gpus] p2p: pair 2-4: GPU 4 is not one of 0..3"},
        {"[gpus]\ncount = 4\np2p = 2-2\n", ":3: [gpus] p2p: pair 2-2 pairs a GPU with itself"},
        {"[gpus]\ncount = 4\np2p = 0-1\nnvlink = 0-1 2-3\n",
         ":4: [gpus] nvlink: GPUs 2 and 3 have NVLink but no P2P (add 2-3 to p2p)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct topology t;
        assert_int_equal(parse_text(cases[i].text, &t), -1);
        char expect[1800];
        snprintf(expect, sizeof expect, "%s/host.ini%s", dir, cases[i].expect);
        printf("# %s\n", sd_errmsg());
        assert_string_equal(sd_errmsg(), expect);
        assert_null(strchr(sd_errmsg(), '\n'));
    }
    struct topology t;
    assert_int_equal(topology_load("/nonexistent/host.ini", &t), -1);
    assert_non_null(strstr(sd_errmsg(), "cannot open the topology file"));
}

/* Ranks beyond the GPUs run on GPU r % count (as slidedp-launch assigns devices): ranks sharing a
 * GPU are peers of each other, and of what that GPU is a peer of, and share its memory. */
static void test_ranks(void **state)
{
    struct topology host, t;
    assert_int_equal(
        parse_text("[gpus]\ncount = 2\nbus = 0000:19:00.0 0000:1a:00.0\nnuma = 0 1\nmemory = 81559 -1\np2p = none\n",
                   &host),
        0);
    topology_for_ranks(&host, 3, &t); /* ranks 0 and 2 on GPU 0, rank 1 on GPU 1 */
    assert_int_equal(t.memory_mib[0], 81559 / 2);
    assert_int_equal(t.memory_mib[2], 81559 / 2);
    assert_int_equal(t.memory_mib[1], -1);
    topology_for_ranks(&host, 2, &t);
    assert_int_equal(t.memory_mib[0], 81559);
    topology_for_ranks(&host, 4, &t);
    assert_int_equal(t.gpus, 4);
    assert_string_equal(t.bus_id[2], "0000:19:00.0");
    assert_int_equal(t.numa[3], 1);
    assert_true(topology_p2p(&t, 0, 2) && topology_p2p(&t, 2, 0) && topology_p2p(&t, 1, 3));
    assert_false(topology_p2p(&t, 0, 1) || topology_p2p(&t, 0, 3) || topology_p2p(&t, 2, 3));
    host.nvlink[0] = 2;
    host.nvlink[1] = 1;
    host.p2p[0] = 2;
    host.p2p[1] = 1;
    topology_for_ranks(&host, 3, &t);
    assert_true(topology_all_p2p(&t, &(int){0}, &(int){0}));
    assert_true(topology_nvlink(&t, 0, 1) && topology_nvlink(&t, 2, 1));
    assert_false(topology_nvlink(&t, 0, 2)); /* the same GPU: no link at all */
    topology_for_ranks(&host, 1, &t);
    assert_int_equal(t.gpus, 1);
    assert_int_equal(t.p2p[0], 0);

    topology_cpu(3, &t);
    assert_int_equal(t.source, TOPO_CPU);
    assert_true(topology_all_p2p(&t, &(int){0}, &(int){0}));
    char line[256];
    topology_describe_gpu(&t, 1, line, sizeof line);
    assert_string_equal(line, "GPU 1: CPU worker, P2P with 0,2 (shared memory)");
    topology_assumed(2, &t);
    assert_false(topology_all_p2p(&t, &(int){0}, &(int){0}));
    assert_string_equal(topology_source_name(t.source), "assumed");
}

static void mkdirs(const char *under, const char *rel)
{
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/%s/%s'", dir, under, rel);
    assert_int_equal(system(cmd), 0);
}

static void link_device(const char *bus, const char *target, int numa)
{
    char p[1600], t[1400];
    snprintf(t, sizeof t, "%s/devices/%s", dir, target);
    snprintf(p, sizeof p, "%s/bus/%s", dir, bus);
    assert_int_equal(symlink(t, p), 0);
    snprintf(p, sizeof p, "%s/numa_node", t);
    char text[16];
    snprintf(text, sizeof text, "%d\n", numa);
    tu_write_file(p, text);
}

/* A fake /sys: two GPUs under one switch (upstream port 0000:17:00.0), one on a root port of its
 * own, one on the root bus of a virtual machine, one whose bus id sysfs does not know. */
static void test_sysfs(void **state)
{
    mkdirs("bus", "");
    const char *sw = "pci0000:16/0000:16:02.0/0000:17:00.0";
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/0000:18:08.0/0000:19:00.0", sw);
    snprintf(b, sizeof b, "%s/0000:18:10.0/0000:1a:00.0", sw);
    mkdirs("devices", a);
    mkdirs("devices", b);
    mkdirs("devices", "pci0000:80/0000:80:01.0/0000:81:00.0");
    mkdirs("devices", "pci0000:00/0000:00:05.0");
    link_device("0000:19:00.0", a, 0);
    link_device("0000:1a:00.0", b, 0);
    link_device("0000:81:00.0", "pci0000:80/0000:80:01.0/0000:81:00.0", 1);
    link_device("0000:00:05.0", "pci0000:00/0000:00:05.0", -1);
    struct topology t;
    topology_assumed(5, &t);
    const char *ids[5] = {"0000:81:00.0", "0000:19:00.0", "0000:1a:00.0", "0000:00:05.0", "0000:ee:00.0"};
    for (int i = 0; i < 5; i++)
        snprintf(t.bus_id[i], TOPO_BUS_ID_MAX, "%s", ids[i]);
    char bus[1100];
    snprintf(bus, sizeof bus, "%s/bus", dir);
    topology_read_sysfs(&t, bus);
    const int numa[5] = {1, 0, 0, -1, -1}, sw_id[5] = {0, 1, 1, 2, -1};
    for (int i = 0; i < 5; i++) {
        printf("# %s: NUMA %d, switch %d\n", ids[i], t.numa[i], t.pcie_switch[i]);
        assert_int_equal(t.numa[i], numa[i]);
        assert_int_equal(t.pcie_switch[i], sw_id[i]);
    }
}

/* [runtime] topology: resolved against the ini's folder, checked when the job is loaded. */
static void test_job_key(void **state)
{
    char p[1200], text[2600];
    snprintf(p, sizeof p, "%s/host.ini", dir);
    tu_write_file(p, "[gpus]\ncount = 4\np2p = all\n");
    snprintf(p, sizeof p, "%s/bad.ini", dir);
    tu_write_file(p, "[gpus]\ncount = 4\np2p = 0-9\n");
    const char *job_text = "[model]\npath = %s\n[data]\ntrain = %s\n[runtime]\ngpus = 4\ntopology = %s\n";
    char model[1100], data[1100];
    snprintf(model, sizeof model, "%s", tu_src("examples/tiny-qwen3"));
    snprintf(data, sizeof data, "%s", tu_src("examples/data/copy-4096.bin"));
    struct job_config job;
    snprintf(text, sizeof text, job_text, model, data, "host.ini");
    snprintf(p, sizeof p, "%s/job.ini", dir);
    tu_write_file(p, text);
    assert_int_equal(job_config_load(p, 0, NULL, &job), 0);
    char expect[2400];
    snprintf(expect, sizeof expect, "%s/host.ini", dir);
    assert_string_equal(job.topology, expect);
    struct topology t;
    assert_int_equal(topology_for_job(&job, "/nonexistent", &t), 0);
    assert_int_equal(t.source, TOPO_FILE);
    assert_int_equal(t.gpus, 4);
    /* the CPU backend without a file: synthetic, every pair with P2P; no child is run */
    char *cpu[] = {"runtime.topology=", "runtime.device=cpu"};
    assert_int_equal(job_config_load(p, 2, cpu, &job), 0);
    assert_int_equal(topology_for_job(&job, "/nonexistent", &t), 0);
    assert_int_equal(t.source, TOPO_CPU);
    /* CUDA without a file: the probe child, here missing */
    char *cuda[] = {"runtime.topology="};
    assert_int_equal(job_config_load(p, 1, cuda, &job), 0);
    assert_int_equal(topology_for_job(&job, "/nonexistent", &t), -1);
    printf("# %s\n", sd_errmsg());
    assert_non_null(strstr(sd_errmsg(), "probing the GPUs"));

    snprintf(text, sizeof text, job_text, model, data, "bad.ini");
    tu_write_file(p, text);
    assert_int_equal(job_config_load(p, 0, NULL, &job), -1);
    printf("# %s\n", sd_errmsg());
    snprintf(expect, sizeof expect, "%s/job.ini:7: [runtime] topology: %s/bad.ini:3: [gpus] p2p: pair 0-9", dir, dir);
    assert_non_null(strstr(sd_errmsg(), expect));
    snprintf(text, sizeof text, job_text, model, data, "missing.ini");
    tu_write_file(p, text);
    assert_int_equal(job_config_load(p, 0, NULL, &job), -1);
    assert_non_null(strstr(sd_errmsg(), "missing.ini' is not a file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_files), cmocka_unit_test(test_bad_files), cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_sysfs),      cmocka_unit_test(test_job_key),
    };
    return cmocka_run_group_tests(tests, make_dir, NULL);
}
