/* slidedp-stat --plot: turns a job's metrics.jsonl into one self-contained SVG (loss and validation
 * loss, learning rate, tokens/s and step time against the step), readable in any browser. */
#ifndef SD_METRICS_PLOT_H
#define SD_METRICS_PLOT_H

/* Reads metrics_path (a trailing line still being written is ignored) and writes svg_path
 * atomically; title heads the figure. */
int metrics_plot(const char *metrics_path, const char *title, const char *svg_path);

#endif
